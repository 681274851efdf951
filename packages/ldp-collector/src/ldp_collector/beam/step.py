"""A round's server step with its accumulators computed on Apache Beam.

A pipeline reads a round's report files (an export, :func:`ldp_collector.columnar.export_round`,
or a landing, :class:`ldp_collector.columnar.ParquetLanding`) and combines them into a report
accumulator with :class:`~ldp_collector.beam.combine.ReportCombineFn` (:func:`combine_rounds`):
first every component's count accumulators (:func:`accumulate_rounds`, the blobs the store would
keep); the engine's existing ``close_round`` then runs on :class:`BeamRoundReports` as on the
store's reports, and each pass its step makes over the raw reports (local-hashing support
counts, vector sums) is a pipeline of its own (:meth:`BeamRoundReports.combine`). So the next
round spec or the result is the in-process one (docs/beam.md: exactly, or within the stated
tolerance where the step sums floats).

The pipeline's files (reports in, accumulators out) must be where every worker can read and
write them: a local directory for the DirectRunner, a shared file system for a cluster.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import pickle
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from ldp_client.spec import RoundSpec

from ..columnar import Manifest, export_round, read_manifest
from ..core import Collector
from ..errors import FailedPreconditionError
from ..estimation.accumulators import RoundCounts, component_params_from_spec
from ..estimation.report_accumulator import ReportAccumulator
from ..kinds.base import RoundReports
from ..model import Campaign
from ..storage.base import StoredReport
from .combine import ReportCombineFn

__all__ = ["DEFAULT_RUNNER", "BeamRoundReports", "accumulate_rounds", "beam_round_reports", "close_round_on_beam",
           "combine_rounds", "pipeline_args"]

#: The runner when none is named: Beam's local runner (``--direct_running_mode=multi_processing``
#: and ``--direct_num_workers=N`` spread it over N local processes).
DEFAULT_RUNNER = "DirectRunner"
_OUTPUT = "accumulators.jsonl"
_A = TypeVar("_A", bound=ReportAccumulator[Any])


def pipeline_args(runner: str | None, options: Sequence[str] = ()) -> list[str]:
    """Beam pipeline arguments: ``--runner`` (default :data:`DEFAULT_RUNNER`) then ``options`` as given."""
    return [f"--runner={runner or DEFAULT_RUNNER}", *options]


class BeamRoundReports(RoundReports):
    """A closed round's reports read from its files, with the accumulators Beam computed.

    :meth:`combine` runs a step's report accumulator as a Beam pipeline over the files (with
    ``args``, default the local runner), so a step that reads raw reports holds its accumulator,
    never the round; an iterative step runs one pipeline per pass. :meth:`batches` refuses: no
    step reads the round into the driver.
    """

    def __init__(self, directories: Sequence[str | os.PathLike[str]], accumulators: Mapping[str, bytes],
                 args: Sequence[str] = (), *, work_dir: str | os.PathLike[str] | None = None) -> None:
        self._directories = list(directories)
        self._manifests = [_complete(d) for d in self._directories]
        self._blobs = dict(accumulators)
        self._args = list(args) or pipeline_args(None)
        self._work_dir = work_dir

    @property
    def count(self) -> int:
        return sum(m.reports for m in self._manifests)

    def batches(self, batch_size: int = 65536) -> Iterator[list[StoredReport]]:
        # Every step reads its round through report accumulators (combine); reading the round's
        # files into the driver would make its memory grow with n, which is what Beam is for avoiding.
        raise FailedPreconditionError("a step on Beam reads its round only through report accumulators (combine)")

    def accumulators(self) -> dict[str, bytes]:
        return dict(self._blobs)

    def combine(self, accumulator: _A) -> _A:
        combined = combine_rounds({"round": (self._directories, accumulator)}, self._args,
                                  work_dir=self._work_dir)["round"]
        return cast(_A, combined)


def _complete(directory: str | os.PathLike[str]) -> Manifest:
    manifest = read_manifest(directory)
    if manifest is None or not manifest.complete:
        raise FailedPreconditionError(f"{directory}: no complete manifest of round reports")
    return manifest


def _round_files(tag: str, directories: Sequence[str | os.PathLike[str]]) -> tuple[RoundSpec, list[str]]:
    """The spec of a round's directories and all their files."""
    manifests = [_complete(d) for d in directories]
    if len({(m.campaign_id, m.round, m.spec) for m in manifests}) != 1:
        raise FailedPreconditionError(f"round {tag}: its directories hold reports of different rounds")
    files = [str(Path(d) / f["path"]) for d, m in zip(directories, manifests) for f in m.files]
    return manifests[0].round_spec, files


def _line(tag: str, accumulator: ReportAccumulator[Any]) -> str:
    # The accumulator goes back to the driver as it is (pickled: Beam already trusts its workers).
    return json.dumps({"round": tag, "state": base64.b64encode(pickle.dumps(accumulator)).decode()})


def combine_rounds(rounds: Mapping[str, tuple[Sequence[str | os.PathLike[str]], ReportAccumulator[Any]]],
                   args: Sequence[str], *,
                   work_dir: str | os.PathLike[str] | None = None) -> dict[str, ReportAccumulator[Any]]:
    """Report accumulators over rounds' files, computed by one Beam pipeline.

    Parameters
    ----------
    rounds : Mapping[str, (Sequence[path], ReportAccumulator)]
        A tag per round: the round's complete report directories (one export, or the directories
        of its landing writers) and an empty accumulator with the step's parameters.
    args : Sequence[str]
        Beam pipeline arguments (:func:`pipeline_args`).
    work_dir : path, optional
        Where the pipeline writes its output (default: a new temporary directory); workers must
        be able to write there.

    Returns
    -------
    dict
        ``{tag: accumulator}``, every report of the round added (:class:`ReportCombineFn`).
    """
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="ldp-beam-"))
    work.mkdir(parents=True, exist_ok=True)
    output = work / _OUTPUT
    output.unlink(missing_ok=True)
    with beam.Pipeline(options=PipelineOptions(list(args))) as pipeline:
        branches = []
        for tag, (directories, prototype) in sorted(rounds.items()):
            _, files = _round_files(tag, directories)
            branches.append(
                pipeline
                | f"files {tag}" >> beam.Create(files)
                | f"combine {tag}" >> beam.CombineGlobally(ReportCombineFn(prototype))
                | f"encode {tag}" >> beam.Map(functools.partial(_line, tag)))
        if branches:
            (tuple(branches) | "rounds" >> beam.Flatten()
             | "write" >> beam.io.WriteToText(str(output), shard_name_template=""))
    out: dict[str, ReportAccumulator[Any]] = {}
    if branches:
        with output.open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                out[row["round"]] = pickle.loads(base64.b64decode(row["state"]))  # our own output
    return out


def accumulate_rounds(rounds: Mapping[str, Sequence[str | os.PathLike[str]]], args: Sequence[str], *,
                      work_dir: str | os.PathLike[str] | None = None) -> dict[str, dict[str, bytes]]:
    """Every round's count accumulator blobs (:class:`RoundCounts`), computed by one Beam pipeline.

    Parameters
    ----------
    rounds : Mapping[str, Sequence[path]]
        A tag per round and the round's complete report directories.
    args, work_dir
        As for :func:`combine_rounds`.

    Returns
    -------
    dict
        ``{tag: {"<group>:<component>": blob}}``, the blobs equal to the store's for the same reports.
    """
    prototypes = {tag: (directories, RoundCounts(component_params_from_spec(_round_files(tag, directories)[0])))
                  for tag, directories in rounds.items()}
    combined = combine_rounds(prototypes, args, work_dir=work_dir)
    return {tag: cast(RoundCounts, combined[tag]).finalize() for tag in rounds}


def beam_round_reports(directories: Sequence[str | os.PathLike[str]], args: Sequence[str], *,
                       work_dir: str | os.PathLike[str] | None = None) -> BeamRoundReports:
    """One round's :class:`BeamRoundReports`: its files and the accumulators a Beam pipeline computed."""
    blobs = accumulate_rounds({"round": directories}, args, work_dir=work_dir)["round"]
    return BeamRoundReports(directories, blobs, args, work_dir=work_dir)


def close_round_on_beam(collector: Collector, campaign_id: str, round: int, export_dir: str | os.PathLike[str],
                        args: Sequence[str]) -> Campaign:
    """Close ``round``, export it to ``export_dir``, compute its accumulators on Beam, run the step.

    The engine's step (:meth:`Collector.close_round`) then stores the estimates and opens the next
    round or stores the result, as in-process. If the export or the pipeline fails, the round
    stays closed and the collector's next tick resumes the step in-process from the store, with
    the same outcome; running this again instead resumes the export and reruns the pipeline.
    """
    def reports(cid: str, closed: int) -> RoundReports:
        export_round(collector.store, cid, closed, export_dir)
        return beam_round_reports([export_dir], args, work_dir=Path(export_dir) / "beam")

    return collector.close_round(campaign_id, round, reports=reports)
