"""The machine and the loop: the transition table, guards, edge selection, run state,
decisions and the sans-IO loop. Nothing here does I/O."""
