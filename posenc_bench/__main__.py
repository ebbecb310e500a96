from posenc_bench.cli import main

raise SystemExit(main())
