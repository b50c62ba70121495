"""The question asked before anything that stops work, inside a widget.

A notebook widget cannot open JupyterLab's dialogs, so it asks in a bar of its own with the
same words and answers as the sidebar's dialog (``format.cancel_question``)::

    Cancel job k3f9x2ab?  resnet (running) will be stopped and will not be retried.
    [Keep it] [Cancel job]
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as w

from ..vocab.schema import JobInfo
from . import format as fmt


class Confirm(w.HBox):
    """A hidden bar; ``ask(job, then)`` shows the question and runs ``then`` on "Cancel job"."""

    def __init__(self) -> None:
        self.question = w.HTML()
        self.keep_button = w.Button(description=fmt.CANCEL_KEEP, layout=w.Layout(width="auto"))
        self.yes_button = w.Button(
            description=fmt.CANCEL_CONFIRM, button_style="danger", layout=w.Layout(width="auto")
        )
        self.keep_button.on_click(lambda _: self.dismiss())
        self.yes_button.on_click(lambda _: self._accept())
        self.job_id: str | None = None
        self._then: Callable[[], None] | None = None
        super().__init__(
            [self.question, self.keep_button, self.yes_button],
            layout=w.Layout(display="none", align_items="center", flex_flow="row wrap"),
        )
        self.add_class("dlsched-confirm")

    @property
    def asking(self) -> bool:
        return self.layout.display != "none"

    def ask(self, job: JobInfo, then: Callable[[], None]) -> None:
        title, body = fmt.cancel_question(job)
        self.job_id = job.id
        self._then = then
        self.question.value = f"<b>{fmt.esc(title)}</b>&nbsp; {fmt.esc(body)}"
        self.layout.display = ""

    def dismiss(self) -> None:
        self.job_id = None
        self._then = None
        self.layout.display = "none"

    def _accept(self) -> None:
        then = self._then
        self.dismiss()
        if then is not None:
            then()
