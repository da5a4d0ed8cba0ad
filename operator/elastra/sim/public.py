"""Loaders for the public Philly and Helios traces, into the simulator's jobs.

- Philly (``msr-fiddle/philly-traces``, ``cluster_job_log``): a JSON list of jobs with
  ``jobid``, ``status``, ``submitted_time`` and ``attempts`` (each with ``start_time``,
  ``end_time`` and ``detail``: the servers and GPUs of the attempt). A job's GPUs are those of
  its last attempt; its duration is the last attempt's run time (earlier attempts were
  restarts). Jobs with no complete attempt or no GPUs are skipped (the trace has some).
- Helios (``S-Lab-System-Group/HeliosData``, ``cluster_log.csv``): ``job_id``, ``gpu_num``,
  ``submit_time``, ``duration`` (seconds) and ``state`` among others. CPU-only jobs
  (``gpu_num`` 0) and zero-length jobs are skipped.

Neither trace names a GPU type or a model, so every job gets ``gpu_type`` and a model by its
size; submit times are made relative to the first job. Skipping is for rows the traces
document as incomplete; a row that is malformed otherwise is a ``UserError`` naming the file,
the record and the field.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from elastra.errors import UserError
from elastra.planner.catalog import lookup
from elastra.sim.models import default_model
from elastra.sim.trace import TraceJob, default_bounds

_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def load_philly(path: str | Path, *, gpu_type: str) -> tuple[TraceJob, ...]:
    """Jobs of a Philly ``cluster_job_log`` file (see the module docstring)."""
    kind = _type(gpu_type)
    try:
        records = json.loads(Path(path).read_text())
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}:{err.lineno}: not valid JSON: {err.msg}") from None
    if not isinstance(records, list):
        raise UserError(f"{path}:1: expected a JSON list of jobs")
    raw: list[tuple[str, datetime, int, float, int]] = []
    for number, record in enumerate(records, start=1):
        where = f"{path}: job #{number}"
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected an object")
        attempts = [a for a in record.get("attempts") or [] if isinstance(a, dict)]
        done = [a for a in attempts if a.get("start_time") and a.get("end_time")]
        if not done:
            continue
        last = done[-1]
        gpus = sum(len(d.get("gpus") or []) for d in last.get("detail") or [])
        if gpus == 0:
            continue
        start = _time(last["start_time"], where, "attempts.start_time")
        end = _time(last["end_time"], where, "attempts.end_time")
        submitted = _time(record.get("submitted_time"), where, "submitted_time")
        duration = (end - start).total_seconds()
        if duration <= 0:
            continue
        raw.append((str(record.get("jobid") or f"job-{number}"), submitted, gpus, duration, number))
    return _jobs(raw, kind, source=str(path))


def load_helios(path: str | Path, *, gpu_type: str) -> tuple[TraceJob, ...]:
    """Jobs of a Helios ``cluster_log.csv`` file (see the module docstring)."""
    kind = _type(gpu_type)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror}") from None
    raw: list[tuple[str, datetime, int, float, int]] = []
    reader = csv.DictReader(io.StringIO(text))
    missing = [
        c
        for c in ("job_id", "gpu_num", "submit_time", "duration")
        if c not in (reader.fieldnames or [])
    ]
    if missing:
        raise UserError(f"{path}:1: missing column {', '.join(missing)} in the header")
    for row in reader:
        where = f"{path}:{reader.line_num}"
        try:
            gpus = int(row["gpu_num"])
        except ValueError:
            raise UserError(f"{where}: gpu_num: {row['gpu_num']!r} is not a number") from None
        try:
            duration = float(row["duration"])
        except ValueError:
            raise UserError(f"{where}: duration: {row['duration']!r} is not a number") from None
        if gpus <= 0 or duration <= 0:
            continue
        submitted = _time(row["submit_time"], where, "submit_time")
        raw.append((row["job_id"], submitted, gpus, duration, reader.line_num))
    return _jobs(raw, kind, source=str(path))


def _jobs(
    raw: list[tuple[str, datetime, int, float, int]], gpu_type: str, *, source: str
) -> tuple[TraceJob, ...]:
    if not raw:
        raise UserError(f"{source}: no GPU jobs with a complete run in the trace")
    origin = min(submitted for _, submitted, _, _, _ in raw)
    jobs = []
    for name, submitted, gpus, duration, line in raw:
        low, high = default_bounds(gpus)
        jobs.append(
            TraceJob(
                name=name,
                submit_s=(submitted - origin).total_seconds(),
                gpus=gpus,
                gpu_type=gpu_type,
                duration_s=duration,
                min_gpus=low,
                max_gpus=high,
                model=default_model(gpus),
                line=line,
            )
        )
    jobs.sort(key=lambda j: j.submit_s)
    return tuple(jobs)


def _type(spelling: str) -> str:
    gpu = lookup(spelling)
    if gpu is None or gpu.is_cpu:
        raise UserError(f"--gpu-type: unknown GPU type {spelling!r}")
    return gpu.name


def _time(value: Any, where: str, field: str) -> datetime:
    text = str(value or "").strip()
    for suffix in (" PDT", " PST", " UTC"):
        text = text.removesuffix(suffix)
    try:
        return datetime.strptime(text, _TIME_FORMAT)
    except ValueError:
        raise UserError(f"{where}: {field}: {value!r} is not 'YYYY-MM-DD HH:MM:SS'") from None
