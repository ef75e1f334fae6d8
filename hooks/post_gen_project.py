"""Drop the folders that only held the other variant's files (cookiecutter leaves them empty),
then say what to run next."""

import os

PROJECT_SLUG = {{ cookiecutter.project_slug | tojson }}

for root, _dirs, _files in os.walk(".", topdown=False):
    if root != "." and not os.listdir(root):
        os.rmdir(root)

print(
    f"\nCreated {PROJECT_SLUG}/. Next, with torch installed (its README says which build):\n\n"
    f"    cd {PROJECT_SLUG}\n"
    '    pip install --no-build-isolation -e ".[test]"\n'
    "    pytest\n"
)
