"""The SQL statements of :class:`~fsm_agent._durable.postgres.PostgresStore` (private).

Each is built once per store with the quoted schema name in place of ``{s}``. Where a
driver's commit is fenced, the fence is part of the one statement that writes — never a
check in a statement before it — so a claim taken between the two cannot slip through.
"""

from __future__ import annotations

__all__ = ["REFUSED", "Statements"]

#: The text of the error a commit sent ahead raises where it committed nothing.
REFUSED = "fsm-agent: the intent was not committed: "

_LEASE = "now() + %(lease)s * interval '1 second'"

#: The fence of a driver's commit: the run is still claimed by this owner at its epoch
#: (an owner whose epoch this store object does not know is checked by token alone).
_FENCE = (
    "SELECT 1 FROM {s}.runs WHERE run_id = %(frun)s AND owner = %(fowner)s "
    "AND epoch = coalesce(%(fepoch)s, epoch) FOR SHARE"
)

#: The fence of a statement sent behind (a checkpoint's parameter names).
_BEHIND_FENCE = (
    "SELECT 1 FROM {s}.runs WHERE run_id = %(run_id)s AND owner = %(owner)s "
    "AND epoch = coalesce(%(epoch)s, epoch) FOR SHARE"
)

# The arrays go in binary: as text, every quote in every JSON body would be escaped in
# Python (measured: ~120 µs per event) before the server unescaped it again.
_EVENTS = """
    INSERT INTO {s}.events (num, seq, type, body, sum, epoch)
    SELECT r.num, x.seq, x.type, x.body, x.sum, r.epoch FROM r,
        unnest(%(seqs)b::integer[], %(types)b::text[], %(bodies)b::text[], %(sums)b::bigint[])
        AS x(seq, type, body, sum)
"""
_MESSAGES = """
    INSERT INTO {s}.messages (num, idx, body, sum)
    SELECT r.num, x.idx, x.body, x.sum FROM r,
        unnest(%(idx)b::integer[], %(mbodies)b::text[], %(msums)b::bigint[]) AS x(idx, body, sum)
    ON CONFLICT (num, idx) DO UPDATE SET body = excluded.body, sum = excluded.sum
"""


#: The fenced update of a driver's checkpoint (the run row, its new events and history
#: rows); the statements built on it end with their own SELECT.
_SAVE = (
    "WITH r AS (UPDATE {s}.runs SET state = %(state)s, reason = %(reason)s, "
    "pending = %(pending)s, runnable = %(runnable)s, ctx = %(ctx)s, sum = %(sum)s, "
    f"updated = now(), lease_until = {_LEASE} "
    "WHERE run_id = %(run_id)s AND owner = %(owner)s "
    "AND epoch = coalesce(%(epoch)s, epoch) RETURNING num, epoch), "
    f"e AS ({_EVENTS}), m AS ({_MESSAGES})"
)


#: A run as ``PostgresStore.load_run`` reads it, from its runs row ``{r}`` in ``{src}``.
_LOADED = (
    "h.body, h.sum, {r}.ctx, {r}.sum, m.i, m.b, m.s, e.i, e.b, e.s, {r}.cancel "
    "FROM {src} JOIN {{s}}.headers h USING (num) "
    "LEFT JOIN LATERAL (SELECT array_agg(idx ORDER BY idx) AS i, "
    "array_agg(body ORDER BY idx) AS b, array_agg(sum ORDER BY idx) AS s "
    "FROM {{s}}.messages WHERE num = {r}.num) m ON true "
    "LEFT JOIN LATERAL (SELECT array_agg(seq ORDER BY seq) AS i, "
    "array_agg(body ORDER BY seq) AS b, array_agg(sum ORDER BY seq) AS s "
    "FROM {{s}}.events WHERE num = {r}.num) e ON true"
)


class Statements:
    def __init__(self, s: str) -> None:  # long: a table of statements, one assignment each
        def q(text: str) -> str:
            return text.replace("{s}", s)

        self.owner_of = q("SELECT owner, epoch FROM {s}.runs WHERE run_id = %s")
        self.begin_intent = q(
            "SELECT * FROM {s}.begin_intent(%(tool)s, %(key)s, %(digest)s, %(crun)s, %(call)s, "
            "%(effect)s, %(dedup)s, %(isum)s, %(rsum)s, %(take_over)s, %(frun)s, %(fowner)s, "
            "%(fepoch)s)"
        )
        self.get_intent = q(
            "SELECT args_digest, status, run_id, call_id, result, effect, dedup, sum, result_sum "
            "FROM {s}.idempotency WHERE tool = %s AND key = %s"
        )
        self.find_intents = q(
            "SELECT tool, key, args_digest, status, run_id, call_id, result, effect, dedup, "
            "sum, result_sum FROM {s}.idempotency WHERE "
            "(%(run_id)s::text IS NULL OR run_id = %(run_id)s) AND "
            "(%(tool)s::text IS NULL OR tool = %(tool)s) AND "
            "(%(digest)s::text IS NULL OR args_digest = %(digest)s) ORDER BY tool, key"
        )
        self.fence_holds = q(_FENCE)
        # Like SqliteStore: the pending intent under the key is committed whoever owns it
        # (a reviewer's reconcile commits another run's intent); the fence is the driver's.
        self.commit_intent = q(
            f"WITH f AS ({_FENCE}) "
            "UPDATE {s}.idempotency SET status = 'committed', result = %(result)s, "
            "result_sum = %(rsum)s, updated = now() "
            "WHERE tool = %(tool)s AND key = %(key)s AND status = 'pending' "
            "AND (NOT %(fenced)s OR EXISTS (SELECT 1 FROM f)) RETURNING 1"
        )
        # A commit sent ahead of the driver's next statement, in its transaction: no row
        # committed raises (a cast that cannot succeed, so the statements behind it are
        # rolled back with it), and the store then asks why (``PostgresStore._flush``).
        # (Not a constant: PostgreSQL would fold a constant ELSE at planning and raise.)
        self.commit_behind = q(
            f"WITH f AS ({_BEHIND_FENCE}), u AS (UPDATE {{s}}.idempotency "
            "SET status = 'committed', result = %(result)s, result_sum = %(rsum)s, updated = now() "
            "WHERE tool = %(tool)s AND key = %(key)s AND status = 'pending' "
            "AND EXISTS (SELECT 1 FROM f) RETURNING 1) "
            f"SELECT CASE WHEN count(*) = 1 THEN 1 ELSE ('{REFUSED}' || count(*))::integer END "
            "FROM u"
        )
        self.abort_intent = q(
            f"WITH f AS ({_FENCE}) "
            "DELETE FROM {s}.idempotency WHERE tool = %(tool)s AND key = %(key)s "
            "AND status = 'pending' AND run_id = %(run)s AND call_id = %(call)s "
            "AND (NOT %(fenced)s OR EXISTS (SELECT 1 FROM f)) RETURNING 1"
        )
        self.create_run = q(
            "WITH r AS (INSERT INTO {s}.runs (run_id, state, reason, pending, runnable, ctx, "
            "sum, owner, epoch, lease_until) VALUES (%(run_id)s, %(state)s, %(reason)s, "
            f"%(pending)s, %(runnable)s, %(ctx)s, %(sum)s, %(owner)s, 1, {_LEASE}) "
            "ON CONFLICT (run_id) DO NOTHING RETURNING num, epoch), "
            "h AS (INSERT INTO {s}.headers (num, body, sum) "
            "SELECT num, %(header)s, %(hsum)s FROM r), "
            f"e AS ({_EVENTS}), m AS ({_MESSAGES}) SELECT num, epoch FROM r"
        )
        self.save = q(f"{_SAVE} SELECT num FROM r")
        # A driving's last checkpoint lets the claim go in the same statement (and
        # announces a run a worker may drive, as ``release`` does): one round trip.
        self.save_release = q(
            _SAVE.replace(
                f"lease_until = {_LEASE}", "owner = NULL, lease_until = '-infinity'"
            ).replace("RETURNING num, epoch", "RETURNING num, epoch, run_id, runnable")
            + " SELECT num, CASE WHEN runnable THEN pg_notify(%(channel)s, run_id) END FROM r"
        )
        # A decision judged on a version of the run its decider read (``record_review(
        # seen=)``): written only while nobody holds the run and it is still at that
        # version (its checkpoint's checksum and its last event), its row left as a
        # review's claim and release would leave it (the epoch counted, nobody holding
        # it, announced if a worker may drive it). No row back: it moved on, nothing
        # written. After ``lock_row`` in the same transaction, so its snapshot is taken
        # once any writer of the row before it has committed.
        self.lock_row = q("SELECT 1 FROM {s}.runs WHERE run_id = %s FOR UPDATE")
        self.save_if_at = q(
            _SAVE.replace(
                f"lease_until = {_LEASE}",
                "owner = NULL, lease_until = '-infinity', epoch = epoch + 1, "
                "claimed_at = clock_timestamp()",
            )
            .replace(
                "AND owner = %(owner)s AND epoch = coalesce(%(epoch)s, epoch)",
                "AND owner IS NULL AND sum = %(seen_sum)s AND coalesce((SELECT max(x.seq) "
                "FROM {s}.events x WHERE x.num = runs.num), -1) = %(seen_seq)s",
            )
            .replace("RETURNING num, epoch", "RETURNING num, epoch, run_id, runnable")
            + " SELECT num, CASE WHEN runnable THEN pg_notify(%(channel)s, run_id) END FROM r"
        )
        self.save_behind = q(
            f"{_SAVE} SELECT CASE WHEN count(*) = 1 THEN 1 "
            f"ELSE ('{REFUSED}' || count(*))::integer END FROM r"
        )
        # A submitted run's first driver records its own settings: the header is
        # replaced only while the run has no event (its run_start is the driver's), fenced.
        self.adopt_run = q(
            "WITH r AS (SELECT num FROM {s}.runs WHERE run_id = %(run_id)s "
            "AND owner = %(owner)s AND epoch = coalesce(%(epoch)s, epoch) FOR UPDATE), "
            "n AS (SELECT count(*) AS c FROM {s}.events e JOIN r USING (num)), "
            "h AS (UPDATE {s}.headers h SET body = %(header)s, sum = %(hsum)s FROM r, n "
            "WHERE h.num = r.num AND n.c = 0 RETURNING 1) "
            "SELECT (SELECT count(*) FROM r), (SELECT c FROM n)"
        )
        # A keyed write's checkpoint and its intent in one statement (one round trip, no
        # BEGIN/COMMIT): the intent is begun only for the row the fenced UPDATE returned;
        # no row back means the owner lost its claim and nothing was written. That
        # UPDATE's row lock fences the intent as begin_intent's own FOR SHARE would (so
        # it is passed no fence, and the run's epoch).
        self.save_begin_intent = q(
            f"{_SAVE} SELECT b.* FROM r CROSS JOIN LATERAL {{s}}.begin_intent("
            "%(tool)s, %(key)s, %(digest)s, %(crun)s, %(call)s, %(effect)s, %(dedup)s, "
            "%(isum)s, %(rsum)s, %(take_over)s, NULL, NULL, r.epoch) b"
        )
        # Which checkpoints sent ahead landed (``PostgresStore._settle_refused``): the
        # run's last stored event.
        self.last_seq = q(
            "SELECT (SELECT max(e.seq) FROM {s}.events e WHERE e.num = r.num) "
            "FROM {s}.runs r WHERE r.run_id = %s"
        )
        self.load_run = q(f"SELECT {_LOADED.format(r='r', src='{s}.runs r')} WHERE r.run_id = %s")
        self.list_runs = q(
            "SELECT run_id, state, reason, pending, extract(epoch FROM created)::float8, "
            "extract(epoch FROM updated)::float8 FROM {s}.runs "
            "WHERE %(state)s::text IS NULL OR state = %(state)s ORDER BY updated DESC"
        )
        self.events_since = q(
            "SELECT e.seq, e.body, e.sum FROM {s}.events e JOIN {s}.runs r USING (num) "
            "WHERE r.run_id = %(run_id)s AND e.seq > %(seq)s ORDER BY e.seq LIMIT %(limit)s"
        )
        keys = "key_id, name, scope, salt, digest, created, revoked"
        self.add_key = q(
            f"INSERT INTO {{s}}.api_keys ({keys}) SELECT %s, %s, %s, %s, %s, %s, %s "
            "WHERE NOT EXISTS (SELECT 1 FROM {s}.api_keys WHERE name = %s AND revoked IS NULL) "
            "RETURNING key_id"
        )
        self.get_key = q(f"SELECT {keys} FROM {{s}}.api_keys WHERE key_id = %s")
        self.list_keys = q(f"SELECT {keys} FROM {{s}}.api_keys ORDER BY created")
        self.revoke_key = q(
            "UPDATE {s}.api_keys SET revoked = %s WHERE name = %s AND revoked IS NULL "
            "RETURNING key_id"
        )
        self.lock_run = q(
            "SELECT owner, lease_until < now() FROM {s}.runs WHERE run_id = %s FOR UPDATE"
        )
        self.take_run = q(
            "UPDATE {s}.runs SET owner = %(owner)s, epoch = epoch + 1, "
            f"lease_until = {_LEASE}, claimed_at = clock_timestamp() "
            "WHERE run_id = %(run_id)s RETURNING epoch"
        )
        # A claim of a run nobody holds (or this owner does), without judging a holder:
        # ``claim_and_load`` tries it first and judges only when it takes nothing.
        self.take_free = q(
            "UPDATE {s}.runs SET owner = %(owner)s, epoch = epoch + 1, "
            f"lease_until = {_LEASE}, claimed_at = clock_timestamp() "
            "WHERE run_id = %(run_id)s AND (owner IS NULL OR owner = %(owner)s) RETURNING epoch"
        )
        # The claim and the run it took, read back in the same statement (the driver
        # reads it next: one round trip, not two). The claim changes none of what is
        # read, so the statement's snapshot is the run as claimed.
        self.claim_next = q(
            "WITH c AS (SELECT num, owner AS previous, claimed_at IS NULL AS first "
            "FROM {s}.runs WHERE runnable AND (owner IS NULL OR lease_until < now()) "
            "AND run_id <> ALL(%(skip)s::text[]) "
            "ORDER BY updated LIMIT 1 FOR UPDATE SKIP LOCKED), "
            "u AS (UPDATE {s}.runs r SET owner = %(owner)s, epoch = r.epoch + 1, "
            f"lease_until = {_LEASE}, claimed_at = clock_timestamp() FROM c "
            "WHERE r.num = c.num RETURNING r.num, r.run_id, r.epoch, r.state, c.previous, "
            "c.first, r.ctx, r.sum, r.cancel) "
            "SELECT u.run_id, u.epoch, u.state, u.previous, u.first, "
            + _LOADED.format(r="u", src="u")
        )
        # Claims made in this PID space (``owners.here_prefix``) under a live lease: the
        # worker asks the kernel whether their processes still run.
        self.held_here = q(
            "SELECT run_id, owner FROM {s}.runs WHERE runnable AND owner LIKE %(prefix)s "
            "AND lease_until >= now() AND run_id <> ALL(%(skip)s::text[]) "
            "ORDER BY updated LIMIT 32"
        )
        # A dead owner's claim, taken only if that owner still holds it (fenced).
        self.take_from = q(
            "UPDATE {s}.runs SET owner = %(owner)s, epoch = epoch + 1, "
            f"lease_until = {_LEASE}, claimed_at = clock_timestamp() "
            "WHERE run_id = %(run_id)s AND owner = %(dead)s AND runnable "
            "RETURNING run_id, epoch"
        )
        # The renewal returns the run's cancel request: the driver learns of one with
        # the heartbeat it sends anyway, never by a read of its own.
        self.renew = q(
            f"UPDATE {{s}}.runs SET lease_until = {_LEASE} WHERE run_id = %(run_id)s "
            "AND owner = %(owner)s AND epoch = coalesce(%(epoch)s, epoch) RETURNING cancel"
        )
        # Whoever holds the run: the first request stays (asking again changes nothing),
        # and a run that has ended gets none. Its state and the request now stored; the
        # work channel is told (``cancel:<run id>``), so a worker driving the run renews
        # its lease at once and learns of it then (a hint: the renewal is what counts).
        self.request_cancel = q(
            "WITH r AS (SELECT num, state, cancel FROM {s}.runs WHERE run_id = %(run_id)s "
            "FOR UPDATE), u AS (UPDATE {s}.runs x SET cancel = %(cancel)s FROM r "
            "WHERE x.num = r.num AND r.cancel IS NULL AND NOT r.state = ANY(%(ended)s) "
            "RETURNING x.cancel) SELECT r.state, coalesce((SELECT cancel FROM u), r.cancel), "
            "pg_notify(%(channel)s, 'cancel:' || %(run_id)s) FROM r"
        )
        self.release = q(
            "WITH r AS (UPDATE {s}.runs SET owner = NULL, lease_until = '-infinity' "
            "WHERE run_id = %(run_id)s AND owner = %(owner)s RETURNING run_id, runnable) "
            "SELECT pg_notify(%(channel)s, run_id) FROM r WHERE runnable"
        )
        self.prune_runs = q(
            "DELETE FROM {s}.runs WHERE owner IS NULL AND state = ANY(%(finished)s) "
            "AND updated < now() - %(age)s * interval '1 second' RETURNING num"
        )
        self.prune_rows = q(
            "WITH e AS (DELETE FROM {s}.events WHERE num = ANY(%(nums)s)), "
            "m AS (DELETE FROM {s}.messages WHERE num = ANY(%(nums)s)) "
            "DELETE FROM {s}.headers WHERE num = ANY(%(nums)s)"
        )
        self.prune_intents = q(
            "DELETE FROM {s}.idempotency WHERE status = 'committed' "
            "AND updated < now() - %(age)s * interval '1 second'"
        )
        self.report_worker = q(
            "INSERT INTO {s}.workers AS w (worker, host, pid, concurrency, state, active, "
            "claimed, finished, released, failed, fenced) VALUES (%(worker)s, %(host)s, "
            "%(pid)s, %(concurrency)s, %(state)s, %(active)s, %(claimed)s, %(finished)s, "
            "%(released)s, %(failed)s, %(fenced)s) ON CONFLICT (worker) DO UPDATE SET "
            "state = excluded.state, active = excluded.active, claimed = excluded.claimed, "
            "finished = excluded.finished, released = excluded.released, "
            "failed = excluded.failed, fenced = excluded.fenced, seen = now()"
        )
        self.workers = q(
            "SELECT worker, state, concurrency, active, claimed, finished, released, failed, "
            "fenced, extract(epoch FROM now() - seen)::float8, "
            "extract(epoch FROM started)::float8 FROM {s}.workers ORDER BY started"
        )
        self.queue = q(
            "SELECT state, count(*), count(*) FILTER (WHERE runnable AND owner IS NULL), "
            "count(*) FILTER (WHERE owner IS NOT NULL AND lease_until >= now()), "
            "count(*) FILTER (WHERE runnable AND owner IS NOT NULL AND lease_until < now()) "
            "FROM {s}.runs GROUP BY state ORDER BY state"
        )
        self.consume_approval = q(
            "SELECT {s}.consume_approval(%(approval)s, %(max)s, %(run)s, %(call)s)"
        )
        self.approval_uses = q(
            "SELECT count(*) FROM {s}.approval_uses WHERE approval_id = %(approval)s"
        )
