from otel_lockwatch.cli._main import main

raise SystemExit(main())
