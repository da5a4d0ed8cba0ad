"""Loaders for the public Philly and Helios trace formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastra.errors import UserError
from elastra.sim.public import load_helios, load_philly

PHILLY = [
    {
        "status": "Pass",
        "jobid": "application_1",
        "submitted_time": "2017-10-07 01:11:39",
        "attempts": [
            {
                "start_time": "2017-10-07 01:12:09",
                "end_time": "2017-10-07 01:13:23",
                "detail": [{"ip": "m47", "gpus": ["gpu0", "gpu1"]}],
            },
            {
                "start_time": "2017-10-07 01:13:30",
                "end_time": "2017-10-07 03:13:30",
                "detail": [
                    {"ip": "m412", "gpus": ["gpu0", "gpu1", "gpu2", "gpu3"]},
                    {"ip": "m413", "gpus": ["gpu0", "gpu1", "gpu2", "gpu3"]},
                ],
            },
        ],
    },
    {
        "status": "Killed",
        "jobid": "never-ran",
        "submitted_time": "2017-10-07 01:00:00",
        "attempts": [],
    },
    {
        "status": "Pass",
        "jobid": "application_2",
        "submitted_time": "2017-10-07 01:00:00",
        "attempts": [
            {
                "start_time": "2017-10-07 01:00:05",
                "end_time": "2017-10-07 01:30:05",
                "detail": [{"ip": "m1", "gpus": ["gpu3"]}],
            }
        ],
    },
]

HELIOS = """\
job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue
1425511,uX,vcJ,1,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,2020-06-10 04:55:09,36848,0
1425512,uV,vch,4,16,1,FAILED,2020-06-09 18:41:27,2020-06-09 18:41:27,2020-06-09 18:45:36,249,0
1425513,uz,vcp,0,1,1,COMPLETED,2020-06-09 18:41:28,2020-06-09 18:41:28,2020-06-17 14:15:21,675233,0
"""


def test_philly_last_attempt_counts(tmp_path: Path) -> None:
    path = tmp_path / "cluster_job_log"
    path.write_text(json.dumps(PHILLY))
    jobs = load_philly(path, gpu_type="V100-SXM2-32GB")
    assert [(j.name, j.gpus, j.duration_s, j.submit_s) for j in jobs] == [
        ("application_2", 1, 1800.0, 0.0),
        ("application_1", 8, 7200.0, 699.0),
    ]
    assert {j.gpu_type for j in jobs} == {"V100-SXM2-32GB"}


def test_helios_skips_cpu_jobs(tmp_path: Path) -> None:
    path = tmp_path / "cluster_log.csv"
    path.write_text(HELIOS)
    jobs = load_helios(path, gpu_type="A100-SXM-80GB")
    assert [(j.name, j.gpus, j.duration_s, j.submit_s) for j in jobs] == [
        ("1425511", 1, 36848.0, 0.0),
        ("1425512", 4, 249.0, 26.0),
    ]


def test_malformed_public_rows_name_the_place(tmp_path: Path) -> None:
    path = tmp_path / "cluster_log.csv"
    path.write_text(HELIOS.replace(",4,16,", ",four,16,"))
    with pytest.raises(UserError, match=r"cluster_log.csv:3: gpu_num: 'four'"):
        load_helios(path, gpu_type="A100-SXM-80GB")
    with pytest.raises(UserError, match="--gpu-type: unknown GPU type 'K80'"):
        load_helios(tmp_path / "cluster_log.csv", gpu_type="K80")
