"""What the pretended-node runs of a specification module set (imported by the ``*_pretended_cases``
modules): 2 ranks per pretended node and no size threshold, so every group and global average over
several nodes takes the node-aware schedule. The engine reads both variables when it is built
(native_coll/src/lifecycle.c), so they hold for the engines this module's tests build, within a
launch shared with the plain runs (tests/spec_launch.py) instead of a launch of their own."""
import os

import pytest

SETTINGS = {"WA_NODE_SIZE": "2", "WA_HIER_MIN_BYTES": "0"}


@pytest.fixture(autouse=True, scope="module")
def pretended_nodes():
    saved = {name: os.environ.get(name) for name in SETTINGS}
    os.environ.update(SETTINGS)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
