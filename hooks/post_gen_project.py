"""Drop the folders that only held the other variant's files (cookiecutter leaves them empty),
then say what to run next."""

import os
import re
import textwrap

PROJECT_SLUG = {{ cookiecutter.project_slug | tojson }}

for root, _dirs, _files in os.walk(".", topdown=False):
    if root != "." and not os.listdir(root):
        os.rmdir(root)

# The README's own install-and-test commands, so the two cannot differ.
with open("README.md", encoding="utf-8") as f:
    commands = re.search(r"^## Install and test\n.*?^```bash\n(.*?)^```", f.read(), re.S | re.M)[1]
print(
    f"\nCreated {PROJECT_SLUG}/. Next, as its README says:\n\n"
    f"    cd {PROJECT_SLUG}\n{textwrap.indent(commands, '    ')}"
)
