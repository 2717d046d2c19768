"""Keep the columnar pool cache of ``privalign simulate`` out of the user's home during tests."""

import pytest


@pytest.fixture(autouse=True)
def _pool_cache_in_tmp(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PRIVALIGN_CACHE_DIR", str(tmp_path_factory.mktemp("privalign-cache")))
