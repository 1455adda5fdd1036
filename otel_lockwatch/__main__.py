from otel_lockwatch._cli import main

raise SystemExit(main())
