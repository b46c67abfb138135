"""Kubernetes resource quantities ("500m", "1Gi", "2", "1e3", "1.5k") as exact Decimals.

``parse_quantity(s) -> Decimal`` (ValueError on bad input), ``format_quantity(d, fmt)`` gives the canonical
Kubernetes spelling ("1500m", "2Gi", "1k"), ``canonical_quantity(s)`` re-spells a string the way the apiserver
stores it, and ``cmp_quantity(a, b)`` compares two quantities (strings, ints or Decimals).
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation, localcontext

# Same grammar as k8s.io/apimachinery/pkg/api/resource (and the CRD quantity pattern).
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
_RE = re.compile(QUANTITY_PATTERN)

BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DEC_SUFFIX = {v: k for k, v in DECIMAL.items()}
_BIN_SUFFIX = {v: k for k, v in BINARY.items()}

_cache: dict[str, Decimal] = {}


def _ctx():
    return localcontext(prec=60)


def parse_quantity(s: str | int | float | Decimal) -> Decimal:
    """Parse a quantity to an exact Decimal. Raises ValueError for malformed input."""
    if isinstance(s, bool):
        raise ValueError(f"quantities must match the regular expression: {s!r}")
    if isinstance(s, Decimal):
        return s
    if isinstance(s, int):
        return Decimal(s)
    if isinstance(s, float):
        return Decimal(repr(s))
    if not isinstance(s, str):
        raise ValueError(f"invalid quantity {s!r}")
    hit = _cache.get(s)
    if hit is not None:
        return hit
    st = s.strip()
    if not st or not _RE.match(st):
        raise ValueError(f"quantities must match the regular expression '{QUANTITY_PATTERN}'")
    # split number / suffix
    i = 0
    if st[0] in "+-":
        i = 1
    while i < len(st) and (st[i].isdigit() or st[i] == "."):
        i += 1
    num, suffix = st[:i], st[i:]
    with _ctx():
        try:
            value = Decimal(num)
        except InvalidOperation as exc:  # pragma: no cover - regex guards this
            raise ValueError(f"invalid quantity {s!r}") from exc
        if suffix in BINARY:
            value = value * (Decimal(1024) ** BINARY[suffix])
        elif suffix in DECIMAL:
            value = value.scaleb(DECIMAL[suffix])
        elif suffix[:1] in ("e", "E"):
            value = value.scaleb(int(Decimal(suffix[1:])))
        else:  # pragma: no cover
            raise ValueError(f"invalid quantity suffix in {s!r}")
    if len(_cache) < 100000:
        _cache[s] = value
    return value


def is_quantity(s) -> bool:
    try:
        parse_quantity(s)
        return True
    except ValueError:
        return False


def quantity_format_of(s) -> str:
    """"BinarySI", "DecimalSI" or "DecimalExponent" (how the apiserver would re-spell the value)."""
    if isinstance(s, str):
        st = s.strip()
        if st.endswith("i"):
            return "BinarySI"
        if re.search(r"[eE][+-]?[0-9.]+$", st):
            return "DecimalExponent"
    return "DecimalSI"


def format_quantity(value: Decimal | int | str, fmt: str = "DecimalSI") -> str:
    """Canonical spelling: integers with the largest exact suffix, fractions in m/u/n (rounded up to nano)."""
    d = parse_quantity(value) if not isinstance(value, Decimal) else value
    with _ctx():
        sign = "-" if d < 0 else ""
        d = abs(d)
        if d == 0:
            return "0"
        # round up to nano precision like resource.Quantity
        d = d.quantize(Decimal("1e-9"), rounding=ROUND_CEILING) if d != d.to_integral_value() else d
        if fmt == "BinarySI" and d == d.to_integral_value() and d >= 1024:
            n = int(d)
            exp = 0
            while exp < 6 and n % 1024 == 0 and n >= 1024:
                n //= 1024
                exp += 1
            if exp:
                return f"{sign}{n}{_BIN_SUFFIX[exp]}"
            # fall through to decimal when not a multiple of 1024
        if fmt == "DecimalExponent":
            exp = 0
            m = d
            while m != m.to_integral_value():
                m = m.scaleb(3)
                exp -= 3
            n = int(m)
            while n and n % 1000 == 0:
                n //= 1000
                exp += 3
            return f"{sign}{n}" + (f"e{exp}" if exp else "")
        exp = 0
        m = d
        while m != m.to_integral_value():
            m = m.scaleb(3)
            exp -= 3
        n = int(m)
        while n % 1000 == 0 and exp < 18:
            n //= 1000
            exp += 3
        return f"{sign}{n}{_DEC_SUFFIX[exp]}"


def canonical_quantity(s) -> str:
    """The string the apiserver would store for ``s`` (keeps binary vs decimal format)."""
    return format_quantity(parse_quantity(s), quantity_format_of(s))


def cmp_quantity(a, b) -> int:
    x, y = parse_quantity(a), parse_quantity(b)
    return (x > y) - (x < y)


def to_milli(s) -> int:
    """Quantity in milli-units, rounded up (handy for CPU)."""
    return int((parse_quantity(s) * 1000).to_integral_value(rounding=ROUND_CEILING))


def to_int(s) -> int:
    """Quantity as an integer, rounded up (handy for memory bytes, GPU counts)."""
    return int(parse_quantity(s).to_integral_value(rounding=ROUND_CEILING))
