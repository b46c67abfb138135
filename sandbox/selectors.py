"""Label and field selectors.

* ``parse_label_selector("a=b,c in (x,y),!d")`` -> LabelSelector (callable on a labels dict); ValueError on bad syntax.
* ``selector_from_dict({"matchLabels":..., "matchExpressions":...})`` -> LabelSelector for metav1.LabelSelector objects
  (``None`` selects nothing, ``{}`` selects everything, as Kubernetes does for e.g. ClusterQueue namespaceSelector).
* ``parse_field_selector("metadata.name=x,status.phase!=Running")`` -> list of (field, op, value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict) -> bool:
        op = self.op
        if op == "=":
            return labels.get(self.key) == self.values[0]
        if op == "!=":
            return labels.get(self.key) != self.values[0]
        if op == "in":
            return self.key in labels and labels[self.key] in self.values
        if op == "notin":
            return self.key not in labels or labels[self.key] not in self.values
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        if op in ("gt", "lt"):
            v = labels.get(self.key)
            if v is None:
                return False
            try:
                a, b = int(v), int(self.values[0])
            except ValueError:
                return False
            return a > b if op == "gt" else a < b
        return False  # pragma: no cover


class LabelSelector:
    def __init__(self, requirements: list[Requirement] | None, *, nothing: bool = False):
        self.requirements = tuple(requirements or ())
        self.nothing = nothing

    def __call__(self, labels: dict | None) -> bool:
        return self.matches(labels)

    def matches(self, labels: dict | None) -> bool:
        if self.nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements and not self.nothing

    def __repr__(self):
        return f"LabelSelector({self.requirements!r}{', nothing' if self.nothing else ''})"


def _check_key(key: str) -> None:
    if not key or len(key.rsplit("/", maxsplit=1)[-1]) > 63 or not _KEY_RE.match(key):
        raise ValueError(f"invalid label key {key!r}")


def _check_value(v: str) -> None:
    if len(v) > 63 or not _VALUE_RE.match(v):
        raise ValueError(f"invalid label value: {v!r}")


def _split_top(s: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced parentheses in selector")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError("unbalanced parentheses in selector")
    parts.append("".join(cur))
    return parts


_SET_RE = re.compile(r"^\s*(\S+?)\s+(in|notin)\s*\((.*)\)\s*$")


def parse_label_selector(s: str | None) -> LabelSelector:
    if s is None or not s.strip():
        return LabelSelector([])
    reqs: list[Requirement] = []
    for raw in _split_top(s):
        part = raw.strip()
        if not part:
            raise ValueError(f"unable to parse requirement: empty requirement in {s!r}")
        m = _SET_RE.match(part)
        if m:
            key, op, vals = m.group(1), m.group(2), m.group(3)
            _check_key(key)
            values = tuple(v.strip() for v in vals.split(",")) if vals.strip() else ()
            for v in values:
                _check_value(v)
            if op == "in" and not values:
                raise ValueError(f"for 'in' operator, values set can't be empty: {part!r}")
            reqs.append(Requirement(key, op, values))
            continue
        if part.startswith("!"):
            key = part[1:].strip()
            _check_key(key)
            reqs.append(Requirement(key, "!"))
            continue
        for sym, op in (("!=", "!="), ("==", "="), ("=", "="), (">", "gt"), ("<", "lt")):
            if sym in part:
                key, _, value = part.partition(sym)
                key, value = key.strip(), value.strip()
                _check_key(key)
                if op in ("gt", "lt"):
                    try:
                        int(value)
                    except ValueError:
                        raise ValueError(f"for 'Gt', 'Lt' operators, the value must be an integer: {part!r}") from None
                else:
                    _check_value(value)
                reqs.append(Requirement(key, op, (value,)))
                break
        else:
            key = part.strip()
            if " " in key:
                raise ValueError(f"unable to parse requirement: {part!r}")
            _check_key(key)
            reqs.append(Requirement(key, "exists"))
    return LabelSelector(reqs)


def selector_from_dict(sel: dict | None, *, none_matches_all: bool = False) -> LabelSelector:
    """metav1.LabelSelector -> LabelSelector. ``None`` matches nothing unless ``none_matches_all``."""
    if sel is None:
        return LabelSelector([]) if none_matches_all else LabelSelector([], nothing=True)
    reqs: list[Requirement] = []
    for k, v in sorted((sel.get("matchLabels") or {}).items()):
        reqs.append(Requirement(k, "=", (str(v),)))
    for e in sel.get("matchExpressions") or []:
        op = e.get("operator")
        key = e.get("key")
        values = tuple(str(x) for x in (e.get("values") or ()))
        if op == "In":
            reqs.append(Requirement(key, "in", values))
        elif op == "NotIn":
            reqs.append(Requirement(key, "notin", values))
        elif op == "Exists":
            reqs.append(Requirement(key, "exists"))
        elif op == "DoesNotExist":
            reqs.append(Requirement(key, "!"))
        elif op in ("Gt", "Lt"):
            reqs.append(Requirement(key, op.lower(), values[:1]))
        else:
            raise ValueError(f"{op!r} is not a valid label selector operator")
    return LabelSelector(reqs)


def match_labels(sel: dict | None, labels: dict | None) -> bool:
    """Does a metav1.LabelSelector dict (``None`` = nothing) select ``labels``?"""
    return selector_from_dict(sel).matches(labels)


def selector_to_string(sel: dict | None) -> str:
    """metav1.LabelSelector -> the string form (as in a Deployment's status.selector)."""
    if not sel:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        op = e.get("operator")
        vals = ",".join(sorted(e.get("values") or ()))
        if op == "In":
            parts.append(f"{e['key']} in ({vals})")
        elif op == "NotIn":
            parts.append(f"{e['key']} notin ({vals})")
        elif op == "Exists":
            parts.append(e["key"])
        elif op == "DoesNotExist":
            parts.append("!" + e["key"])
    return ",".join(parts)


def parse_field_selector(s: str | None) -> list[tuple[str, str, str]]:
    """``"a=b,c!=d"`` -> [("a", "=", "b"), ("c", "!=", "d")]. ValueError on bad syntax."""
    out: list[tuple[str, str, str]] = []
    if s is None or not s.strip():
        return out
    for raw in s.split(","):
        part = raw.strip()
        if not part:
            continue
        if "!=" in part:
            k, _, v = part.partition("!=")
            op = "!="
        elif "==" in part:
            k, _, v = part.partition("==")
            op = "="
        elif "=" in part:
            k, _, v = part.partition("=")
            op = "="
        else:
            raise ValueError(f"invalid selector: '{s}'; can't understand '{part}'")
        out.append((k.strip(), op, v.strip()))
    return out
