from fsm_agent.cli import main

raise SystemExit(main())
