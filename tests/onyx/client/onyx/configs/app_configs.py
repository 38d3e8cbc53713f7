"""brig's stand-in for onyx's settings module: the one setting the vendored client
reads, `CODE_INTERPRETER_BASE_URL`, from the environment as onyx reads it."""

import os

CODE_INTERPRETER_BASE_URL = os.environ.get("CODE_INTERPRETER_BASE_URL")
