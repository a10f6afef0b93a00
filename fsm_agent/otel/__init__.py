"""Every run as OpenTelemetry GenAI spans: :class:`OpenTelemetry`, an interceptor.

``Runtime(interceptors=[OpenTelemetry()])`` gives each run one ``invoke_agent {agent}``
span (INTERNAL), with one ``chat {model}`` span (CLIENT) per model call and one
``execute_tool {tool}`` span (INTERNAL) per tool attempt under it; transitions, review
pauses and rule verdicts are events of the run span. Needs the ``[otel]`` extra
(``opentelemetry-api`` and ``opentelemetry-semantic-conventions``); the SDK and an
exporter are the application's choice.

Conventions followed: the GenAI semantic conventions as published by
``opentelemetry-semantic-conventions`` 0.59b0 to 0.66b2 (semantic conventions 1.37 to
1.40: ``gen_ai.provider.name``, ``gen_ai.input.messages``/``gen_ai.output.messages``,
``gen_ai.usage.cache_read.input_tokens``). Every convention name is imported from that
package; the names in ``fsm_agent.*`` (this module's constants) are fsm-agent's own facts,
which the conventions do not name. See docs/guides/opentelemetry.md.
"""

from __future__ import annotations

from fsm_agent.otel._interceptor import GUARDRAIL_EVENT, OpenTelemetry

__all__ = ["GUARDRAIL_EVENT", "OpenTelemetry"]
