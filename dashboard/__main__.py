"""``python -m dashboard``: the same as ``streamlit run dashboard`` (extra arguments, such as
``--server.port 8502``, pass through to Streamlit)."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    from streamlit.web import cli

    app = Path(__file__).with_name("streamlit_app.py")
    sys.argv = ["streamlit", "run", str(app), *sys.argv[1:]]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
