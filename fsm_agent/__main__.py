from fsm_agent._cli import main

raise SystemExit(main())
