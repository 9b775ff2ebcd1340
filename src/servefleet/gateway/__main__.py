"""``python -m servefleet.gateway --replica URL ...`` (the same flags as ``servefleet gateway``)."""

from servefleet.gateway.cli import main

if __name__ == "__main__":
    main()
