"""``python -m benchmarks.speed``: see the package docstring."""

from .cli import main

if __name__ == "__main__":
    main()
