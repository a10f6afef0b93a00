"""Your own rules: :class:`Rule` values, compiled together into a :class:`RuleSet`.

Pure values and pure functions, no I/O: the engine judges a phase with
:meth:`RuleSet.judge` (or :meth:`RuleSet.judge_batch` for a batch of calls) and records
each :class:`Judgement` as a ``rule`` event. CEL conditions are compiled and type-checked
once, when the :class:`RuleSet` is built.
"""

from fsm_agent._rules.facts import PASS, Facts, Judgement
from fsm_agent._rules.rule import PHASES, VERDICTS, VERDICTS_BY_PHASE, OpaqueCondition, Rule
from fsm_agent._rules.ruleset import RuleSet, ToolFacts, ToolInfo

__all__ = [
    "PASS",
    "PHASES",
    "VERDICTS",
    "VERDICTS_BY_PHASE",
    "Facts",
    "Judgement",
    "OpaqueCondition",
    "Rule",
    "RuleSet",
    "ToolFacts",
    "ToolInfo",
]
