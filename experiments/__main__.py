"""``python -m experiments [ID|all]``: run lecture experiments and print them (see ``main``)."""
from experiments import main

raise SystemExit(main())
