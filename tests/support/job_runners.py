"""A local runner for tests that records the job's graph before running it, for checks on its shape."""
from __future__ import annotations

from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.portability.fn_api_runner import FnApiRunner


class SideInputRecordingRunner(FnApiRunner):
    """The in-process runner; every step that reads a side input is named in ``steps_with_side_inputs``."""

    steps_with_side_inputs: list[str] = []

    def run_pipeline(self, pipeline, options):
        found = type(self).steps_with_side_inputs

        class Visitor(PipelineVisitor):
            def visit_transform(self, node):
                if node.side_inputs:
                    found.append(node.full_label)

        pipeline.visit(Visitor())
        return super().run_pipeline(pipeline, options)


RUNNER_ARG = f"--runner={__name__}.{SideInputRecordingRunner.__name__}"
