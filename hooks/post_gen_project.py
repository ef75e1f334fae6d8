"""Drop the folders that only held the other variant's files: cookiecutter leaves them empty."""

import os

for root, _dirs, _files in os.walk(".", topdown=False):
    if root != "." and not os.listdir(root):
        os.rmdir(root)
