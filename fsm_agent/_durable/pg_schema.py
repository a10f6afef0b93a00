"""The PostgreSQL schema of :class:`~fsm_agent._durable.postgres.PostgresStore` (private).

Everything lives in one PostgreSQL schema (``fsm_agent`` unless the store is given
another name), whose ``meta`` table marks it as fsm-agent's and records its version.
``MIGRATIONS[n]`` takes the schema from version n to n + 1; each runs in the transaction
that opened the store, under an advisory lock, so two workers starting at once migrate
once. ``{s}`` stands for the quoted schema name.

Design notes:

* ``runs.epoch`` is the fencing token: every claim increments it, and every commit of a
  driver (a checkpoint, an intent) names the epoch it claimed at, so a driver that lost
  its lease commits nothing once another took the run.
* ``runs.runnable`` says whether a worker may drive the run now (a working state, or a
  review whose blocking calls are all decided); the queue is its partial index.
* Leases are judged by the server's clock (``now()``), never a worker's: hosts disagree.
* Events are append-only: a trigger refuses any UPDATE, and their key ``(num, seq)``
  refuses a second row for one sequence number. Each row records the epoch that wrote it.
* ``begin_intent`` is one server-side function: the fence check and the compare-and-set
  of a write's intent are one atomic statement and one round trip.
"""

from __future__ import annotations

from typing import Any

from fsm_agent._durable.pg_conn import store_error
from fsm_agent._errors import StoreError

__all__ = ["APPLICATION", "MIGRATIONS", "SCHEMA_VERSION", "open_schema"]

#: ``meta.application``: the mark of a schema fsm-agent created.
APPLICATION = "fsm-agent"

_V1 = """
CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {s}.runs (
    num          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id       text NOT NULL UNIQUE,
    state        text NOT NULL,
    reason       text NOT NULL DEFAULT '',
    pending      integer NOT NULL DEFAULT 0,
    runnable     boolean NOT NULL DEFAULT false,
    ctx          text NOT NULL,
    sum          bigint,
    owner        text,
    epoch        bigint NOT NULL DEFAULT 0,
    lease_until  timestamptz NOT NULL DEFAULT '-infinity',
    claimed_at   timestamptz,
    created      timestamptz NOT NULL DEFAULT now(),
    updated      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX runs_queue ON {s}.runs (updated) WHERE runnable;
CREATE INDEX runs_by_state ON {s}.runs (state, updated);
CREATE TABLE {s}.headers (num bigint PRIMARY KEY, body text NOT NULL, sum bigint);
CREATE TABLE {s}.events (
    num bigint NOT NULL, seq integer NOT NULL, type text NOT NULL, body text NOT NULL,
    sum bigint, epoch bigint NOT NULL, PRIMARY KEY (num, seq)
);
CREATE TABLE {s}.messages (
    num bigint NOT NULL, idx integer NOT NULL, body text NOT NULL, sum bigint,
    PRIMARY KEY (num, idx)
);
CREATE TABLE {s}.idempotency (
    tool        text NOT NULL,
    key         text NOT NULL,
    args_digest text NOT NULL,
    status      text NOT NULL,
    run_id      text NOT NULL,
    call_id     text NOT NULL,
    result      text,
    effect      text NOT NULL,
    dedup       boolean NOT NULL,
    sum         bigint,
    result_sum  bigint,
    epoch       bigint NOT NULL DEFAULT 0,
    updated     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tool, key)
);
CREATE INDEX idempotency_committed ON {s}.idempotency (updated) WHERE status = 'committed';
CREATE TABLE {s}.workers (
    worker      text PRIMARY KEY,
    host        text NOT NULL,
    pid         integer NOT NULL,
    concurrency integer NOT NULL,
    state       text NOT NULL,
    started     timestamptz NOT NULL DEFAULT now(),
    seen        timestamptz NOT NULL DEFAULT now(),
    active      integer NOT NULL DEFAULT 0,
    claimed     bigint NOT NULL DEFAULT 0,
    finished    bigint NOT NULL DEFAULT 0,
    released    bigint NOT NULL DEFAULT 0,
    failed      bigint NOT NULL DEFAULT 0,
    fenced      bigint NOT NULL DEFAULT 0
);
CREATE FUNCTION {s}.refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'fsm-agent trace events are append-only';
END
$$;
CREATE TRIGGER events_append_only BEFORE UPDATE ON {s}.events
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_update();
CREATE FUNCTION {s}.begin_intent(
    p_tool text, p_key text, p_digest text, p_run text, p_call text, p_effect text,
    p_dedup boolean, p_sum bigint, p_result_sum bigint, p_take_over boolean,
    p_fence_run text, p_fence text, p_epoch bigint
) RETURNS TABLE (
    outcome text, f_digest text, f_status text, f_run text, f_call text, f_result text,
    f_effect text, f_dedup boolean, f_sum bigint, f_result_sum bigint
) LANGUAGE plpgsql AS $$
DECLARE
    r {s}.idempotency%ROWTYPE;
BEGIN
    IF p_fence IS NOT NULL THEN
        -- FOR SHARE: a claim (an UPDATE of this row) waits until this intent is decided.
        PERFORM 1 FROM {s}.runs WHERE run_id = p_fence_run AND owner = p_fence
            AND (p_epoch IS NULL OR epoch = p_epoch) FOR SHARE;
        IF NOT FOUND THEN
            outcome := 'fenced';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    LOOP
        SELECT * INTO r FROM {s}.idempotency i
            WHERE i.tool = p_tool AND i.key = p_key FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO {s}.idempotency (tool, key, args_digest, status, run_id, call_id,
                                         effect, dedup, sum, result_sum, epoch)
            VALUES (p_tool, p_key, p_digest, 'pending', p_run, p_call, p_effect, p_dedup,
                    p_sum, p_result_sum, coalesce(p_epoch, 0))
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                outcome := 'owned';
                RETURN NEXT;
                RETURN;
            END IF;
            CONTINUE;  -- another transaction inserted it meanwhile: read it under lock
        END IF;
        f_digest := r.args_digest; f_status := r.status; f_run := r.run_id;
        f_call := r.call_id; f_result := r.result; f_effect := r.effect;
        f_dedup := r.dedup; f_sum := r.sum; f_result_sum := r.result_sum;
        IF r.status = 'pending' AND ((r.run_id = p_run AND r.call_id = p_call)
                                     OR (p_take_over AND r.args_digest = p_digest)) THEN
            UPDATE {s}.idempotency i SET args_digest = p_digest, run_id = p_run,
                call_id = p_call, effect = p_effect, dedup = p_dedup, sum = p_sum,
                result = NULL, result_sum = p_result_sum, epoch = coalesce(p_epoch, 0),
                updated = now()
            WHERE i.tool = p_tool AND i.key = p_key;
            outcome := 'owned';
        ELSE
            outcome := 'refused';
        END IF;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;
"""

#: 2: the uses of limited approvals, one row per (approval, run, call) that holds one.
#: ``consume_approval`` decides under a transaction-scoped advisory lock per approval id,
#: so concurrent workers count one at a time and never pass ``max_uses``.
_V2 = """
CREATE TABLE {s}.approval_uses (
    approval_id text NOT NULL,
    run_id      text NOT NULL,
    call_id     text NOT NULL,
    spent       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (approval_id, run_id, call_id)
);
CREATE FUNCTION {s}.consume_approval(
    p_approval text, p_max integer, p_run text, p_call text
) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    used integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('fsm-agent approval'), hashtext(p_approval));
    -- (READ COMMITTED: each statement below sees every use committed before the lock.)
    PERFORM 1 FROM {s}.approval_uses
        WHERE approval_id = p_approval AND run_id = p_run AND call_id = p_call;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT count(*) INTO used FROM {s}.approval_uses WHERE approval_id = p_approval;
    IF used >= p_max THEN
        RETURN false;
    END IF;
    INSERT INTO {s}.approval_uses (approval_id, run_id, call_id)
        VALUES (p_approval, p_run, p_call);
    RETURN true;
END
$$;
"""

# 3: the review server: API keys (a salted hash of each), and a notification on the
# ``<schema>_changes`` channel whenever a run row is written (a checkpoint with its new
# events, a claim, a release): the change feed's watch LISTENs there. The payload is the
# run id, a hint only (readers re-read from their last seq).
_V3 = """
CREATE TABLE {s}.api_keys (
    key_id  text PRIMARY KEY,
    name    text NOT NULL,
    scope   text NOT NULL,
    salt    text NOT NULL,
    digest  text NOT NULL,
    created float8 NOT NULL,
    revoked float8
);
CREATE UNIQUE INDEX api_keys_active ON {s}.api_keys (name) WHERE revoked IS NULL;
CREATE FUNCTION {s}.announce_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_changes', NEW.run_id);
    RETURN NULL;
END
$$;
CREATE TRIGGER runs_announce AFTER INSERT OR UPDATE ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.announce_change();
"""

# 4: the change feed announces what a reader can see — a new run, new events (every save
# writes the checkpoint: ``ctx``, whose checksum ``sum`` is compared, not the text, unless
# a row has none), a new state — and no longer a claim, a lease renewal or a release
# alone: a worker's heartbeat or a reviewer's claim woke every stream of every server to
# read nothing (and, 5 ms before the review it belonged to, delayed that review's wake-up
# behind 500 useless ones).
_V4 = """
DROP TRIGGER runs_announce ON {s}.runs;
CREATE TRIGGER runs_announce AFTER INSERT ON {s}.runs
    FOR EACH ROW EXECUTE FUNCTION {s}.announce_change();
CREATE TRIGGER runs_announce_change AFTER UPDATE ON {s}.runs
    FOR EACH ROW WHEN (
        (OLD.state, OLD.reason, OLD.pending, OLD.runnable, OLD.sum)
        IS DISTINCT FROM (NEW.state, NEW.reason, NEW.pending, NEW.runnable, NEW.sum)
        OR (NEW.sum IS NULL AND OLD.ctx IS DISTINCT FROM NEW.ctx)
    ) EXECUTE FUNCTION {s}.announce_change();
"""

# 5: a cancel asked of a run while it was driven (or before it is driven again), for its
# driver (JSON text of ``CancelRequest``, NULL where none was asked): on the runs row, so
# the heartbeat's renewal returns it (``UPDATE … RETURNING cancel``) and a claim reads it
# with the run. Not announced on the change feed (the trigger's columns): the run's
# events and state do not change until its driver honours it.
_V5 = """
ALTER TABLE {s}.runs ADD COLUMN cancel text;
"""

MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5)

#: The schema version this code writes.
SCHEMA_VERSION = len(MIGRATIONS)


def open_schema(
    conn_string: str,
    name: str,
    schema: str,
    *,
    readonly: bool,
    create: bool,
    timeouts: tuple[float, float],
) -> None:
    """Check (and create or migrate) ``schema`` on a connection of its own, so a bad DSN
    or a foreign schema is reported with its precise cause. ``timeouts``: the store's
    connection and statement timeouts (for the messages)."""
    import psycopg

    try:
        with psycopg.connect(conn_string, autocommit=True) as conn, conn.transaction():
            if not readonly:
                # Workers starting together create and migrate the schema once.
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext(%s))",
                    [f"fsm-agent:{schema}"],
                )
            version = _version(conn, name, schema)
            if version == SCHEMA_VERSION:
                return
            if readonly or not create:
                raise StoreError(
                    f"{name}: "
                    + (
                        f"no fsm-agent schema {schema!r} in this database"
                        if version is None
                        else f"schema version {version} needs migrating to this "
                        "fsm-agent's; open it writable once"
                    )
                )
            _migrate(conn, schema, version or 0)
    except psycopg.Error as exc:
        raise store_error(name, exc, *timeouts) from None


def _version(conn: Any, name: str, schema: str) -> int | None:
    """The schema's version; ``None`` where it does not exist yet. Refuses a schema
    of another program and one written by a newer fsm-agent."""
    s = schema
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid), "
        "to_regclass(quote_ident(n.nspname) || '.meta') IS NOT NULL "
        "FROM pg_namespace n WHERE n.nspname = %s",
        [s],
    ).fetchone()
    if row is None:
        return None
    objects, has_meta = row
    if not has_meta:
        if objects:
            raise StoreError(
                f"{name}: schema {s!r} is not fsm-agent's (it holds {objects} "
                "other tables or objects); give PostgresStore another schema"
            )
        return 0
    meta = dict(conn.execute(f'SELECT key, value FROM "{s}".meta').fetchall())
    if meta.get("application") != APPLICATION:
        raise StoreError(
            f"{name}: schema {s!r} is not fsm-agent's (its meta table names "
            f"{meta.get('application')!r})"
        )
    version = int(meta.get("schema_version", "0"))
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{name}: schema version {version} is newer than this fsm-agent "
            f"supports ({SCHEMA_VERSION}); upgrade fsm-agent to open it"
        )
    return version


def _migrate(conn: Any, schema: str, version: int) -> None:
    s = f'"{schema}"'
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
    for step in range(version, SCHEMA_VERSION):
        conn.execute(MIGRATIONS[step].replace("{s}", s))
    conn.execute(
        f"INSERT INTO {s}.meta VALUES ('application', %s), ('schema_version', %s) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [APPLICATION, str(SCHEMA_VERSION)],
    )
