"""Every exception fsm-agent raises or asks tools to raise, in one tree.

::

    FsmAgentError
    ├── ConfigError (ValueError)          a Runtime, tool, budget or approval that cannot work
    ├── ArgumentsError (ValueError)       tool-call arguments that are not one strict JSON object
    ├── ToolSignal                        raised *by tools* to tell the engine what happened
    │   ├── TransientToolError            may pass if retried (reads, dedup writes only)
    │   └── ToolRejected                  definitely nothing happened
    ├── TraceError (ValueError)           a trace file that cannot be read (names file:line)
    ├── StoreError                        a store that cannot do what was asked (names the cause)
    │   ├── RunNotFound (KeyError)        no run with this id
    │   ├── RunExists                     a new run's id is already stored
    │   ├── RunBusy                       another live owner drives the run
    │   ├── MachineMismatch               a checkpoint written under another transition table
    │   ├── CorruptRecord                 a stored row that fails its checksum or cannot be read
    │   └── IntentConflict                an idempotency intent that is not this call's to change
    ├── ReviewError (ValueError)          a review action that does not fit the paused run
    ├── ModelError                        a provider call that ends the run (model_error)
    │   ├── ModelAuthError                credentials refused (401/403)
    │   ├── ModelRequestError             the request itself refused (other 4xx)
    │   ├── ModelResponseError            an answer that cannot be read as a decision
    │   ├── ModelUnavailableError         retries exhausted or past the deadline
    │   └── HistoryError                  a history the provider rejects (or would)
    ├── McpToolError                      an MCP server reported a call as failed (isError)
    ├── McpServerStartError               an MCP server that did not start (command, stderr)
    ├── RenderError                       no renderer could draw; says what to install
    ├── StepError (ValueError)            a replay step outside the trace
    └── UsageError                        bad command-line flags or files (exit 2)
        └── ModelArgsError (ValueError)   a --model flag combination that cannot work

Catch :class:`FsmAgentError` to catch everything fsm-agent raises on purpose. Bad *model
output* never raises: it ends the run in a terminal state instead (R12 of docs/concepts/rules.md).
"""

from __future__ import annotations

__all__ = [
    "ArgumentsError",
    "ConfigError",
    "CorruptRecord",
    "FsmAgentError",
    "HistoryError",
    "IntentConflict",
    "MachineMismatch",
    "McpServerStartError",
    "McpToolError",
    "ModelArgsError",
    "ModelAuthError",
    "ModelError",
    "ModelRequestError",
    "ModelResponseError",
    "ModelUnavailableError",
    "RenderError",
    "ReviewError",
    "RunBusy",
    "RunExists",
    "RunNotFound",
    "StepError",
    "StoreError",
    "ToolRejected",
    "ToolSignal",
    "TraceError",
    "TransientToolError",
    "UsageError",
]


class FsmAgentError(Exception):
    """The root of every exception fsm-agent defines."""


class ConfigError(FsmAgentError, ValueError):
    """A misconfigured ``Runtime``, tool, budget or approval; raised at construction."""


class ArgumentsError(FsmAgentError, ValueError):
    """Tool-call arguments that are not one strict JSON object."""


class ToolSignal(FsmAgentError):
    """Base of the exceptions a tool raises to tell the engine what happened."""


class TransientToolError(ToolSignal):
    """Raised by a tool (or its trusted adapter) for a failure that may pass if retried.

    Only read tools, and write tools whose registrar declares downstream deduplication,
    are retried on it. For any other write it means the outcome is unknown.
    """


class ToolRejected(ToolSignal):
    """Raised by a tool for a definite rejection: nothing happened, nothing to review."""


class TraceError(FsmAgentError, ValueError):
    """A trace file that cannot be read: names the file and the 1-based line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


class StoreError(FsmAgentError):
    """A store that cannot do what was asked: a newer schema, a corrupt or locked file, a
    bad path, a lost connection. The message names the store and the cause."""


class RunNotFound(StoreError, KeyError):
    """No run with this id is stored."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "run not found"


class RunExists(StoreError):
    """A new run's id is already stored."""


class RunBusy(StoreError):
    """Another live owner (process, thread or worker) drives this run; it was not touched."""


class MachineMismatch(StoreError):
    """A checkpoint recorded under another transition table (its machine hash differs)."""


class CorruptRecord(StoreError):
    """A stored row that fails its checksum or cannot be read back."""


class IntentConflict(StoreError):
    """An idempotency intent that this (run, call) does not own, or that is not there."""


class ReviewError(FsmAgentError, ValueError):
    """A review action that does not fit the run (not paused, call not pending, ...)."""


class ModelError(FsmAgentError):
    """A provider call failed in a way that ends the run (``protocol_error/model_error``)."""


class ModelAuthError(ModelError):
    """The provider refused the credentials (HTTP 401/403)."""


class ModelRequestError(ModelError):
    """The provider refused the request itself (another 4xx): not worth retrying."""


class ModelResponseError(ModelError):
    """The provider's answer cannot be read as a decision (empty, not JSON, a stop
    reason we do not know, a truncated answer)."""


class ModelUnavailableError(ModelError):
    """Retries are exhausted, or the next one would end past the wall-clock budget."""


class HistoryError(ModelError):
    """A history the provider would reject (found before sending), or did reject."""


class McpToolError(FsmAgentError):
    """The server reported the call as failed (``isError``); it may still have acted."""


class McpServerStartError(FsmAgentError):
    """An MCP server that could not be started or did not answer the handshake: names
    the command and the end of what it wrote to stderr."""

    def __init__(self, command: str, cause: str, stderr: str) -> None:
        tail = stderr.strip()[-_STDERR_TAIL:]
        said = f"; its stderr ends: {tail}" if tail else "; it wrote nothing to stderr"
        super().__init__(f"MCP server {command!r} did not start: {cause}{said}")
        self.command = command
        self.stderr = stderr


#: How much of a failed server's stderr its start error quotes.
_STDERR_TAIL = 1000


class RenderError(FsmAgentError):
    """No renderer could draw the picture; the message says what to install."""


class StepError(FsmAgentError, ValueError):
    """A step number outside the trace; the message says how many steps there are."""


class UsageError(FsmAgentError):
    """Bad command-line flags or files: exit 2 with a one-line message."""


class ModelArgsError(UsageError, ValueError):
    """A model flag that cannot work, said in one line."""
