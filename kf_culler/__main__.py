from kf_culler.cli import main

raise SystemExit(main())
