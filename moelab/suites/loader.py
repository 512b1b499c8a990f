"""Load a suite file (TOML) and expand it into cases.

A suite has a base `[workload]`, `[axes]` whose cartesian product gives the cases, optional
`[[exclude]]` tables (a case matching every key of one is dropped), and per-backend sections
`[backend.NAME.workload]` (base overrides, e.g. the low-latency kernels' own defaults) and
`[backend.NAME.axes]` (extra axes; names that are not workload fields become backend knobs). A workload
may give `experts` (total) instead of `experts_per_rank`, as published configurations do (256 experts at
any EP): each run divides it by its ranks.
A combination the workload rejects becomes a case with `skip_reason`, stored as skipped, never a gap.
A top-level `repeat = N` starts each backend job N times (as `moelab run --repeat N`, which wins).

A suite built in code (verify, tune) may instead list its cases explicitly, in order: `cases`, one mapping per
case with its `backend` and the values that differ from the base (a workload field, `sms` or a knob).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from moelab.core.e2e_spec import a2a_knobs
from moelab.core.errors import SpecError
from moelab.core.spec import MAX_REPEATS, CaseSpec
from moelab.core.workload import MAX_SMS, RoutingSpec, Workload

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

WORKLOAD_KEYS = ("hidden", "tokens_per_rank", "topk", "experts_per_rank", "dtype")
ROUTING_KEYS = {
    "routing": "kind",
    "seed": "seed",
    "zipf_s": "zipf_s",
    "hot_experts": "hot_experts",
    "hot_share": "hot_share",
    "group_ranks": "group_ranks",
    "topk_groups": "topk_groups",
}
TOTAL_EXPERTS_KEY = (
    "experts"  # total experts; experts per rank = experts / the run's ranks (published configurations)
)
CASE_KEYS = set(WORKLOAD_KEYS) | set(ROUTING_KEYS) | {"sms", TOTAL_EXPERTS_KEY}
MAX_SUITE_BYTES = 1 << 20  # a suite is a page of TOML; more is a wrong path (or /dev/zero)
MAX_DEPTH = 8  # top level > backend > NAME > axes > key > values: deeper is no suite
MAX_CASES = 100_000  # planned cases of one run (a run of this many takes days on a GPU)


@dataclass(frozen=True, kw_only=True, slots=True)
class Suite:
    name: str
    description: str
    workload: dict[str, Any]
    axes: dict[str, list[Any]]
    exclude: list[dict[str, Any]] = field(default_factory=list)
    backend_workload: dict[str, dict[str, Any]] = field(default_factory=dict)
    backend_axes: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    source: str = ""
    cases: tuple[Mapping[str, Any], ...] = ()  # explicit cases, in order (suites built in code only)
    repeat: int = 1  # starts of each backend job (`repeat = N`; --repeat wins)


def builtin_suites() -> dict[str, Path]:
    folder = resources.files("moelab.suites")
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".toml")}


def suite_file(name_or_path: str) -> Path:
    """The file a suite name or path reads: a built-in suite's, else the path."""
    return builtin_suites().get(name_or_path) or Path(name_or_path)


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, or a suite file by path."""
    path = suite_file(name_or_path)
    if not path.exists():
        raise SpecError(
            f"no suite {name_or_path!r}: not a file, and the built-in suites are {', '.join(sorted(builtin_suites()))}"
        )
    if not path.is_file():
        raise SpecError(f"cannot read suite file {path}: not a regular file")
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_SUITE_BYTES + 1)
        if len(raw) > MAX_SUITE_BYTES:
            raise SpecError(f"suite file {path} is larger than {MAX_SUITE_BYTES // 1024} KiB: not a suite")
        data = tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read suite file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"malformed suite file {path}: {exc}") from exc
    except RecursionError:
        raise SpecError(f"malformed suite file {path}: nested deeper than any suite") from None
    return parse_suite(data, source=str(path))


def _check_values(value: Any, where: str, source: str, depth: int = 0) -> None:
    """Every value a suite holds is one the spec and the store keep: strings, finite numbers, booleans,
    and lists or tables of them, nested no deeper than a suite is."""
    if depth > MAX_DEPTH:
        raise SpecError(f"{source}: {where} is nested deeper than any suite ({MAX_DEPTH} levels)")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_values(v, f"{where}.{k}" if where else str(k), source, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_values(v, where, source, depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{source}: {where} = {value}: suite numbers must be finite")
    elif not isinstance(value, str | int | float | bool):
        raise SpecError(
            f"{source}: {where} = {value!r}: suite values are strings, numbers, booleans or lists "
            f"(a {type(value).__name__} is none of them)"
        )


def _as_list(key: str, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise SpecError(f"axis {key!r} is empty")
    return values


def parse_suite(data: Mapping[str, Any], source: str = "<suite>") -> Suite:
    _check_values(dict(data), "", source)
    known_top = {"name", "description", "workload", "axes", "exclude", "backend", "repeat"}
    unknown = set(data) - known_top
    if unknown:
        raise SpecError(
            f"{source}: unknown suite key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(known_top))})"
        )
    for key in ("workload", "axes", "backend"):
        if key in data and not isinstance(data[key], dict):
            raise SpecError(
                f"{source}: [{key}] must be a table, got {type(data[key]).__name__} {data[key]!r}"
            )
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise SpecError(f"{source}: {key} must be a string, got {data[key]!r}")
    repeat = data.get("repeat", 1)
    if not isinstance(repeat, int) or isinstance(repeat, bool) or not 1 <= repeat <= MAX_REPEATS:
        raise SpecError(f"{source}: repeat must be a whole number from 1 to {MAX_REPEATS:,}, got {repeat!r}")
    workload = dict(data.get("workload", {}))
    for key in workload:
        if key not in CASE_KEYS - {"sms"}:
            raise SpecError(f"{source}: unknown workload key {key!r}")
    if TOTAL_EXPERTS_KEY in workload and "experts_per_rank" in workload:
        raise SpecError(f"{source}: [workload] sets both experts (total) and experts_per_rank: keep one")
    axes = {k: _as_list(k, v) for k, v in dict(data.get("axes", {})).items()}
    for key in axes:
        if key not in CASE_KEYS:
            raise SpecError(
                f"{source}: unknown axis {key!r}; axes are {', '.join(sorted(CASE_KEYS))} (backend knobs go under [backend.NAME.axes])"
            )
    exclude = data.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(e, dict) for e in exclude):
        raise SpecError(f"{source}: 'exclude' must be a list of tables ([[exclude]])")
    backend_workload: dict[str, dict[str, Any]] = {}
    backend_axes: dict[str, dict[str, list[Any]]] = {}
    for bname, section in dict(data.get("backend", {})).items():
        if not isinstance(section, dict) or set(section) - {"workload", "axes"}:
            raise SpecError(f"{source}: [backend.{bname}] may hold only 'workload' and 'axes'")
        for part in ("workload", "axes"):
            if part in section and not isinstance(section[part], dict):
                raise SpecError(f"{source}: [backend.{bname}.{part}] must be a table")
        backend_workload[bname] = dict(section.get("workload", {}))
        for key in backend_workload[bname]:
            if key not in CASE_KEYS - {"sms"}:
                raise SpecError(f"{source}: unknown workload key {key!r} in [backend.{bname}.workload]")
        backend_axes[bname] = {k: _as_list(k, v) for k, v in dict(section.get("axes", {})).items()}
    _check_exclude(exclude, set(axes) | {k for a in backend_axes.values() for k in a} | CASE_KEYS, source)
    _check_exclude_values(
        exclude, [workload, *backend_workload.values()], [axes, *backend_axes.values()], source
    )
    _check_every_value(source, "workload", workload, axes)
    for bname in backend_workload:
        _check_every_value(source, f"backend.{bname}", backend_workload[bname], backend_axes[bname])
    return Suite(
        name=str(data.get("name", Path(source).stem)),
        description=str(data.get("description", "")),
        workload=workload,
        axes=axes,
        exclude=list(exclude),
        backend_workload=backend_workload,
        backend_axes=backend_axes,
        source=source,
        repeat=repeat,
    )


def _check_every_value(
    source: str, where: str, workload: Mapping[str, Any], axes: Mapping[str, list[Any]]
) -> None:
    """Each workload value and axis value of the file on its own, as a case would check it: a flag that
    replaces an axis at run time (--experts-per-rank) must not hide a value the file could never run
    (`experts_per_rank = 1.5`). Knobs (keys that are no case key) are the backend's to check."""
    pairs = [(f"[{where}]", k, v) for k, v in workload.items()]
    pairs += [
        (f"[{where}.axes]" if where != "workload" else "[axes]", k, v) for k, vs in axes.items() for v in vs
    ]
    for section, key, value in pairs:
        if key not in CASE_KEYS:
            continue
        try:
            if key == "sms":
                _parse_sms(value)
            elif key == TOTAL_EXPERTS_KEY:
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise SpecError(f"experts must be a positive integer (total experts), got {value!r}")
            else:
                _build_workload({key: value}).check_values()
        except SpecError as exc:
            raise SpecError(f"{source}: {section} {key}: {exc}") from None
        except TypeError as exc:
            raise SpecError(f"{source}: {section} {key} = {value!r}: {exc}") from None


def _check_exclude(exclude: list[dict[str, Any]], known: set[str], source: str) -> None:
    """An [[exclude]] key that names no axis, workload field or knob would exclude nothing, silently."""
    for i, ex in enumerate(exclude, 1):
        if not ex:
            raise SpecError(f"{source}: [[exclude]] number {i} is empty (it would exclude every case)")
        unknown = sorted(set(ex) - known)
        if unknown:
            raise SpecError(
                f"{source}: [[exclude]] number {i} names {', '.join(map(repr, unknown))}, which is no axis, "
                f"workload key or knob of this suite (known: {', '.join(sorted(known))})"
            )


def _match_value(key: str, value: Any) -> Any:
    """A value as an [[exclude]] compares it: an SM count as the case holds it (`"default"` and `0` are
    one setting), any other value as written."""
    if key == "sms":
        try:
            return ("sms", _parse_sms(value))
        except SpecError:
            return ("bad sms", repr(value))
    return value


def _check_exclude_values(
    exclude: list[dict[str, Any]],
    workloads: list[Mapping[str, Any]],
    axes: list[Mapping[str, list[Any]]],
    source: str,
) -> None:
    """An [[exclude]] value that none of the file's own values of its key can equal excludes nothing
    (`hidden = 512` beside an axis of 128 and 256, `sms = "16"` beside 16). Keys the file does not set
    (their values come from flags or defaults) are not held to it."""
    declared: dict[str, list[Any]] = {}
    for section in workloads:
        for key, value in section.items():
            declared.setdefault(key, []).append(value)
    for section in axes:
        for key, values in section.items():
            declared.setdefault(key, []).extend(values)
    for i, ex in enumerate(exclude, 1):
        for key, value in ex.items():
            if key not in declared:
                continue
            own = [_match_value(key, v) for v in declared[key]]
            if _match_value(key, value) not in own:
                said = ", ".join(dict.fromkeys(repr(v) for v in declared[key]))
                raise SpecError(
                    f"{source}: [[exclude]] number {i}: {key} = {value!r} is none of this suite's values of "
                    f"{key} ({said}): it would exclude nothing"
                )


def _excluded(values: Mapping[str, Any], exclude: list[dict[str, Any]]) -> bool:
    return any(
        all(_match_value(k, values.get(k)) == _match_value(k, v) for k, v in ex.items()) for ex in exclude
    )


def _parse_sms(value: Any) -> int | None:
    """A whole number of SMs, or None for the library's own choice ('default', or 0). Not `value in (...,
    0)`: `false` and `0.0` equal 0, and a suite holding them is a mistake, not a default."""
    if value is None or value == "default":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SMS:
        return value or None
    raise SpecError(f"sms must be a whole number from 1 to {MAX_SMS:,} or 'default', got {value!r}")


def _build_workload(values: Mapping[str, Any]) -> Workload:
    wl = {k: values[k] for k in WORKLOAD_KEYS if k in values}
    routing = {ROUTING_KEYS[k]: values[k] for k in ROUTING_KEYS if k in values}
    return Workload(routing=RoutingSpec(**routing), **wl)


def case_id_for(workload: Workload, sms: int | None, knobs: Mapping[str, Any]) -> str:
    parts = [workload.label(), f"sm{sms if sms is not None else 'def'}"]
    parts += [f"{k}={knobs[k]}" for k in sorted(knobs)]
    return "-".join(str(p) for p in parts)


def expand(
    suite: Suite,
    backends: Iterable[str],
    world: int,
    overrides: Mapping[str, list[Any]] | None = None,
    backend_defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[CaseSpec]:
    """Cases for every backend: suite axes (replaced by CLI `overrides`), per-backend axes as knobs. A suite
    with explicit `cases` gives those, in their order, each over the same axes."""
    overrides = dict(overrides or {})
    backends = list(backends)
    rows: tuple[Mapping[str, Any], ...] = suite.cases or tuple({"backend": b} for b in backends)
    for row in rows:
        if row.get("backend") not in backends:
            raise SpecError(
                f"{suite.source}: a case names backend {row.get('backend')!r}, not one of this run's"
            )
    cases: list[CaseSpec] = []
    seen: set[tuple[str, str]] = set()
    planned = 0
    for row in rows:
        backend = row["backend"]
        explicit = {k: v for k, v in row.items() if k != "backend"}
        base = dict((backend_defaults or {}).get(backend, {}))
        base.update(suite.workload)
        base.update(suite.backend_workload.get(backend, {}))
        axes: dict[str, list[Any]] = dict(suite.axes)
        axes.update(suite.backend_axes.get(backend, {}))
        for key, axis_values in overrides.items():
            axes[key] = axis_values
            base.pop(key, None)
        names = list(axes)
        planned += math.prod(len(axes[n]) for n in names)
        if planned > MAX_CASES:
            raise SpecError(
                f"{suite.source}: the suite expands to more than {MAX_CASES:,} cases; narrow its axes "
                "(or run a part of it with --case)"
            )
        for combo in itertools.product(*(axes[n] for n in names)):
            values = dict(base)
            values.update(zip(names, combo, strict=True))
            values.update(explicit)
            if _excluded(values, suite.exclude):
                continue
            case = _case(suite, backend, values, world)
            if (backend, case.case_id) in seen:
                continue
            seen.add((backend, case.case_id))
            cases.append(case)
    return cases


def _experts_per_rank(suite: Suite, values: dict[str, Any], world: int) -> str | None:
    """A suite's `experts` (total) becomes experts per rank for this world; a value set per rank (a flag)
    wins. Returns the skip reason when `world` does not divide it."""
    experts = values.pop(TOTAL_EXPERTS_KEY, None)
    if experts is None or "experts_per_rank" in values:
        return None
    if not isinstance(experts, int) or isinstance(experts, bool) or experts < 1:
        raise SpecError(
            f"{suite.source}: experts must be a positive integer (total experts), got {experts!r}"
        )
    values["experts_per_rank"] = max(1, experts // world)
    return None if experts % world == 0 else f"{experts} experts do not divide over {world} ranks"


def _case(suite: Suite, backend: str, values: dict[str, Any], world: int) -> CaseSpec:
    experts_skip = _experts_per_rank(suite, values, world)
    sms = _parse_sms(values.pop("sms", None))
    knobs = a2a_knobs({k: values.pop(k) for k in list(values) if k not in CASE_KEYS})
    try:
        workload = _build_workload(values)
    except TypeError as exc:
        raise SpecError(f"{suite.source}: bad workload values {values}: {exc}") from exc
    workload.check_values()  # a value no run could use is an error, not a skipped case
    skip: str | None = experts_skip
    try:
        workload.validate(world)
    except SpecError as exc:
        skip = skip or str(exc)
    case = CaseSpec.from_asked(
        knobs=knobs,
        case_id=case_id_for(workload, sms, knobs),
        backend=backend,
        workload=workload,
        sms=sms,
        skip_reason=skip,
    )
    combination = case.e2e.combination_reason(sms) if case.e2e is not None else None
    return replace(case, skip_reason=combination) if combination and not skip else case
