"""The trace contract: a CSV of jobs, read whole and checked before anything is simulated.

Columns (header required, order free, unknown columns rejected so typos do not pass):
``name,submitTime,gpus,gpuType,durationSeconds`` and optionally
``minGpus,maxGpus,model,priority``.
``submitTime`` is seconds from the trace start; ``durationSeconds`` is how long the job ran on
``gpus`` GPUs of ``gpuType`` (a catalog name, a GPU Feature Discovery label, or a marketing
name such as ``H100``, see ``resolve_type``). ``minGpus``/``maxGpus`` bound an elastic job
(``minGpus <= gpus <= maxGpus``; defaults below); ``model`` names a profile in
``elastra.sim.models`` (default by size); ``priority`` is the value of the job's PriorityClass
(a whole number, default 0), which decides who gives GPUs to whom when the elastic policies
share (``elastra.elastic.share``).

Every problem is a ``UserError`` naming the file, the line and the field, raised before a
single job is returned: nothing is simulated from half-read input.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elastra.errors import UserError
from elastra.planner.catalog import CATALOG, GpuType, lookup, matches
from elastra.sim.models import BY_NAME, default_model, profile

REQUIRED = ("name", "submitTime", "gpus", "gpuType", "durationSeconds")
OPTIONAL = ("minGpus", "maxGpus", "model", "priority")
COLUMNS = REQUIRED + OPTIONAL


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace, checked. ``gpu_type`` is the catalog name; ``line`` the CSV line."""

    name: str
    submit_s: float
    gpus: int
    gpu_type: str
    duration_s: float
    min_gpus: int
    max_gpus: int
    model: str
    line: int = 0
    priority: int = 0
    """Its PriorityClass value: a starved job takes GPUs only from jobs of no higher one."""


def default_bounds(gpus: int) -> tuple[int, int]:
    """Elastic bounds of a row without ``minGpus``/``maxGpus``: down to half, never above.

    Growing past the request needs the user's consent (``maxGpus``); starting on half of it
    is what an elastic job's ``minReplicas`` usually allows.
    """
    return max(1, gpus // 2), gpus


def parse_trace(text: str, *, source: str) -> tuple[TraceJob, ...]:
    """Jobs of a trace CSV, sorted by submit time (stable), or a ``UserError``."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise UserError(
            f"{source}:1: empty trace (expected a header with {', '.join(REQUIRED)})"
        ) from None
    header = [h.strip() for h in header]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise UserError(f"{source}:1: missing column {', '.join(missing)} in the header")
    unknown = [c for c in header if c not in COLUMNS]
    if unknown:
        raise UserError(
            f"{source}:1: unknown column {', '.join(unknown)} (allowed: {', '.join(COLUMNS)})"
        )
    index = {name: i for i, name in enumerate(header)}
    jobs: list[TraceJob] = []
    names: dict[str, int] = {}
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise UserError(f"{source}:{line}: {len(row)} fields, the header has {len(header)}")
        job = _row(row, index, source=source, line=line)
        if job.name in names:
            raise UserError(
                f"{source}:{line}: name: {job.name!r} already used on line {names[job.name]}"
            )
        names[job.name] = line
        jobs.append(job)
    if not jobs:
        raise UserError(f"{source}:2: no jobs after the header")
    jobs.sort(key=lambda j: j.submit_s)
    return tuple(jobs)


def load_trace(path: str | Path) -> tuple[TraceJob, ...]:
    """Read and check a trace file."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror}") from None
    return parse_trace(text, source=str(path))


def _row(row: Sequence[str], index: dict[str, int], *, source: str, line: int) -> TraceJob:
    def cell(name: str) -> str:
        return row[index[name]].strip() if name in index else ""

    def fail(name: str, problem: str) -> UserError:
        return UserError(f"{source}:{line}: {name}: {problem}")

    def number(name: str) -> float:
        raw = cell(name)
        try:
            value = float(raw)
        except ValueError:
            raise fail(name, f"{raw!r} is not a number") from None
        if not math.isfinite(value):
            raise fail(name, f"{raw!r} is not a finite number")
        return value

    def count(name: str) -> int:
        raw = cell(name)
        try:
            value = int(raw)
        except ValueError:
            raise fail(name, f"{raw!r} is not a whole number") from None
        if value < 1:
            raise fail(name, f"{value} must be >= 1")
        return value

    name = cell("name")
    if not name:
        raise fail("name", "empty")
    submit = number("submitTime")
    if submit < 0:
        raise fail("submitTime", f"{submit:g} is negative (seconds from the trace start)")
    gpus = count("gpus")
    spelling = cell("gpuType")
    gpu = resolve_type(spelling) if spelling else None
    if gpu is None or gpu.is_cpu:
        raise fail("gpuType", f"unknown GPU type {spelling!r} (use a catalog name such as H100)")
    duration = number("durationSeconds")
    if duration <= 0:
        raise fail("durationSeconds", f"{duration:g} must be > 0")
    low, high = default_bounds(gpus)
    min_gpus = count("minGpus") if cell("minGpus") else low
    max_gpus = count("maxGpus") if cell("maxGpus") else max(high, gpus)
    if min_gpus > gpus:
        raise fail("minGpus", f"{min_gpus} is above gpus={gpus}")
    if max_gpus < gpus:
        raise fail("maxGpus", f"{max_gpus} is below gpus={gpus}")
    model = cell("model").lower() or default_model(gpus)
    if profile(model) is None:
        raise fail("model", f"unknown model {model!r} (one of {', '.join(BY_NAME)})")
    priority = cell("priority") or "0"
    if not priority.lstrip("-").isdigit():
        raise fail("priority", f"{priority!r} is not a whole number (a PriorityClass value)")
    return TraceJob(
        name=name,
        submit_s=submit,
        gpus=gpus,
        gpu_type=gpu.name,
        duration_s=duration,
        min_gpus=min_gpus,
        max_gpus=max_gpus,
        model=model,
        line=line,
        priority=int(priority),
    )


def resolve_type(spelling: str) -> GpuType | None:
    """A catalog type from a name, a product label, or a marketing name such as ``H100``
    (which picks the first catalog entry it selects: the SXM part)."""
    gpu = lookup(spelling)
    if gpu is None:
        gpu = next((g for g in CATALOG if matches(spelling, g)), None)
    return gpu


def format_trace(jobs: Iterable[TraceJob]) -> str:
    """Jobs as a trace CSV with every column (what ``parse_trace`` reads back)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for job in jobs:
        writer.writerow(
            [
                job.name,
                _seconds(job.submit_s),
                job.gpus,
                job.gpu_type,
                _seconds(job.duration_s),
                job.min_gpus,
                job.max_gpus,
                job.model,
                job.priority,
            ]
        )
    return out.getvalue()


def _seconds(value: float) -> str:
    """Seconds to the millisecond, without trailing zeros."""
    return f"{value:.3f}".rstrip("0").rstrip(".")
