from posenc_bench.commands.cli import main

raise SystemExit(main())
