"""Owns fault rules a policy file adds or extends (``rules:``), validated so that errors point into
that file, and composing them with the built-in table (``compose_rules``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from .rules import BUILTIN_RULES, ID_SHAPE, FaultRule

# User rules from a policy file (validated here, so errors point into that file).

_USER_KEYS = frozenset({"id", "patterns", "excludes", "strength", "restartable", "explanation", "live", "extends"})
_EXTEND_KEYS = frozenset({"id", "patterns", "excludes", "extends"})
_NO_RULES = frozenset({"hang", "unknown"})  # decided by a timer / by elimination


def _need(ok: bool, message: str) -> None:
    # Policy errors are ValueErrors (the policy loader reports them as such), even
    # where the cause is a value of the wrong type.
    if not ok:
        raise ValueError(message)


def load_user_rules(data: object, source: str) -> tuple[FaultRule, ...]:
    """Validate the ``rules`` list of a policy file into FaultRules.

    A rule whose id is a built-in one must say ``extends: true``; its patterns and
    excludes are then added to the built-in rule's, and the result carries the
    merged rule under the built-in id.  Errors name the file, the item and the field,
    e.g. ``policy.yaml:12: rules[2].patterns[0]: invalid regex '(': ...``.
    """
    if data is None:
        return ()
    _need(isinstance(data, list), f"{source}: rules: expected a list of mappings, got {type(data).__name__}")
    assert isinstance(data, list)
    builtin = {r.id: r for r in BUILTIN_RULES}
    out: list[FaultRule] = []
    for n, item in enumerate(data):
        where = f"{source}: rules[{n}]"
        _need(isinstance(item, dict), f"{where}: expected a mapping, got {type(item).__name__}")
        assert isinstance(item, dict)
        unknown = sorted(str(k) for k in item if k not in _USER_KEYS)
        _need(not unknown, f"{where}: unknown keys: {', '.join(unknown)} (allowed: {', '.join(sorted(_USER_KEYS))})")
        rid = item.get("id")
        _need(isinstance(rid, str) and ID_SHAPE.fullmatch(rid) is not None,
              f"{where}.id: expected lowercase letters, digits and _ (e.g. my_fault), got {rid!r}")
        assert isinstance(rid, str)
        _need(all(r.id != rid for r in out), f"{where}.id: {rid!r} is defined twice")
        _need(rid not in _NO_RULES, f"{where}.id: {rid!r} is decided without line rules and takes no patterns")
        extends = item.get("extends", False)
        _need(isinstance(extends, bool), f"{where}.extends: expected true or false, got {extends!r}")
        patterns = _regex_list(item, "patterns", where, required=True)
        excludes = _regex_list(item, "excludes", where, required=False)
        if not extends:
            _need(rid not in builtin,
                  f"{where}.id: {rid!r} is a built-in fault; set extends: true to add patterns to it")
        else:
            _need(rid in builtin, f"{where}.extends: {rid!r} is not a built-in fault, so there is nothing to extend")
            extra = sorted(str(k) for k in item if k not in _EXTEND_KEYS)
            _need(not extra, f"{where}: {', '.join(extra)} cannot be changed when extending a built-in fault")
            base = builtin[rid]
            out.append(replace(base, patterns=base.patterns + patterns, excludes=base.excludes + excludes))
            continue
        strength = item.get("strength", "root")
        _need(strength in ("root", "weak"), f"{where}.strength: expected 'root' or 'weak', got {strength!r}")
        restartable, live = item.get("restartable", True), item.get("live", False)
        for name, value in (("restartable", restartable), ("live", live)):
            _need(isinstance(value, bool), f"{where}.{name}: expected true or false, got {value!r}")
        explanation = item.get("explanation", f"matched user rule {rid} from {source}")
        _need(isinstance(explanation, str), f"{where}.explanation: expected a string, got {explanation!r}")
        out.append(FaultRule(id=rid, patterns=patterns, excludes=excludes,
                             strength="weak" if strength == "weak" else "root", restartable=bool(restartable),
                             explanation=str(explanation), live=bool(live)))
    return tuple(out)


def _regex_list(item: dict[object, object], name: str, where: str, *, required: bool) -> tuple[str, ...]:
    value = item.get(name)
    if value is None and not required:
        return ()
    _need(isinstance(value, list) and bool(value),
          f"{where}.{name}: expected a non-empty list of regexes, got {value!r}")
    assert isinstance(value, list)
    for i, p in enumerate(value):
        _need(isinstance(p, str), f"{where}.{name}[{i}]: expected a string, got {p!r}")
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"{where}.{name}[{i}]: invalid regex {p!r}: {exc}") from None
    return tuple(value)


def compose_rules(user: Sequence[FaultRule], builtin: Sequence[FaultRule] = BUILTIN_RULES) -> tuple[FaultRule, ...]:
    """The effective rule table: new user faults first (their wording is the more
    specific), then the built-ins in their order with extended ones replaced in place."""
    ids = {r.id for r in builtin}
    override = {r.id: r for r in user if r.id in ids}
    return tuple(r for r in user if r.id not in ids) + tuple(override.get(r.id, r) for r in builtin)
