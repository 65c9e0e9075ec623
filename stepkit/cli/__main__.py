"""``python -m stepkit.cli``: the same as the ``stepkit`` command."""

from stepkit.cli import main

if __name__ == "__main__":
    main()
