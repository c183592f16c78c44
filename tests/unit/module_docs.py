"""A module's DOCUMENTATION says what its argument spec takes (options, types, defaults,
check mode), read by running main() up to AnsibleModule."""

import pytest
import yaml


def documented_spec(monkeypatch, module):
    """(DOCUMENTATION parsed, the argument spec main() passes) after asserting they agree."""
    seen = {}

    class Capture:
        def __init__(self, argument_spec, supports_check_mode):
            seen.update(spec=argument_spec, check_mode=supports_check_mode)
            raise SystemExit(0)

    monkeypatch.setattr(module, "AnsibleModule", Capture)
    with pytest.raises(SystemExit):
        module.main()
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert seen["check_mode"] is True and set(doc["options"]) == set(seen["spec"])
    for name, spec in seen["spec"].items():
        assert doc["options"][name]["type"] == spec["type"], name
        assert doc["options"][name].get("default") == spec.get("default"), name
    return doc, seen["spec"]
