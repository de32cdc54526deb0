"""workbench.vllm's entry modules load names on first use (workbench/vllm/runtime/lazy.py)."""

import json

import pytest

from workbench.vllm.runtime.lazy import lazy_getattr


def test_a_listed_name_is_loaded_from_its_module():
    get = lazy_getattr("entry", {"json": ("dumps",)})
    assert get("dumps") is json.dumps


def test_an_unlisted_name_raises_attribute_error_naming_the_entry():
    get = lazy_getattr("entry", {"json": ("dumps",)})
    with pytest.raises(AttributeError, match="module 'entry' has no attribute 'loads'"):
        get("loads")


def test_a_patch_of_the_defining_module_reaches_later_lookups(monkeypatch):
    get = lazy_getattr("entry", {"json": ("dumps",)})
    get("dumps")
    monkeypatch.setattr(json, "dumps", len)
    assert get("dumps") is len


def test_the_vllm_entries_answer_unknown_names_as_modules_do():
    import workbench.vllm as v

    with pytest.raises(AttributeError, match="workbench.vllm"):
        v.no_such_name
