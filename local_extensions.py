"""Jinja filters: answers are free text, so quote them for the file they land in."""

import json

from cookiecutter.utils import simple_filter


@simple_filter
def toml_str(value):
    """A TOML basic string holding ``value`` verbatim (quotes, backslashes, non-ASCII included)."""
    # JSON string escapes are a subset of TOML's; TOML also wants DEL escaped.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
