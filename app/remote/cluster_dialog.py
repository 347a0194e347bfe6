"""The "Cluster…" dialog: hosts (ssh name, IP), backend, tensor or pipeline, model folder and
port; "Write hosts.json" writes mlx.launch's hostfile (checked as ``engine serve --hostfile``
checks it: ``app.remote.cluster.ClusterPlan.write``) and shows the exact command that starts
the cluster, with a Copy button. "Start over SSH" runs that command here (the first host must
be this machine; mlx.launch reaches the others over SSH), shows its output live and can be
cancelled (its whole process group ends; closing the dialog only hides it, quitting the app
stops the cluster); once the server says it listens,
``server_ready(url)`` is emitted (the app then adds it as a connection)."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (QButtonGroup, QComboBox, QDialog, QFileDialog, QFormLayout,
                               QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QRadioButton, QSpinBox, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

from app.remote.cluster import STEP_TIMEOUT_S, ClusterPlan, default_hostfile
from engine.distributed.launch import DEFAULT_PORT
from engine.errors import ClusterError
from engine.resources import default_model_path


KILL_AFTER_S = 15.0


class ProcessOutput(QObject):
    """A process's output lines, read on a thread: ``line(str)``, then ``ended(code)``.
    ``start()`` runs it: connect the signals first, or a quick process's lines and its end
    are emitted to no one (a command that fails at once would leave the dialog running)."""

    line = Signal(str)
    ended = Signal(int)

    def __init__(self, cmd: list[str]) -> None:
        super().__init__()
        self.cmd = cmd
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        threading.Thread(target=self._read, daemon=True, name="cluster-output").start()

    def _read(self) -> None:
        for text in self.proc.stdout:
            self.line.emit(text.rstrip("\n"))
        self.proc.stdout.close()
        self.ended.emit(self.proc.wait())

    def cancel(self) -> None:
        """End the launcher, mlx.launch and every rank it started here (one group)."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGTERM)  # the ranks drain; a rank that hangs is killed
            threading.Timer(KILL_AFTER_S, self._signal, (signal.SIGKILL,)).start()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class ClusterDialog(QDialog):
    server_ready = Signal(str)

    def __init__(self, parent: QWidget | None = None, *, hostfile: Path | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Cluster — MTP Chat")
        self.hostfile = Path(hostfile) if hostfile else default_hostfile()
        self.written: Path | None = None
        self.running: ProcessOutput | None = None
        lay = QVBoxLayout(self)
        intro = QLabel("Serve one model from several machines (MLX distributed). Every host "
                       "needs this app's engine, the same model folder path and SSH access "
                       "from the first host, which serves the API.")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        lay.addWidget(self._hosts_box())
        lay.addLayout(self._options())
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Cluster status")
        lay.addWidget(self.status)
        self.command = QPlainTextEdit()
        self.command.setReadOnly(True)
        self.command.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.command.setMaximumHeight(70)
        self.command.setAccessibleName("Command that starts the cluster")
        lay.addWidget(self.command)
        lay.addLayout(self._buttons())
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.output.setPlaceholderText("The cluster's output appears here once started.")
        self.output.setAccessibleName("Cluster output")
        lay.addWidget(self.output, 1)
        self.resize(720, 640)

    def _hosts_box(self) -> QWidget:
        box = QWidget()
        v = QVBoxLayout(box)
        v.setContentsMargins(0, 0, 0, 0)
        self.hosts = QTableWidget(2, 2)
        self.hosts.setHorizontalHeaderLabels(["Host (ssh name)", "IP address"])
        self.hosts.horizontalHeader().setStretchLastSection(True)
        self.hosts.setColumnWidth(0, 260)
        self.hosts.setAccessibleName("Hosts, rank 0 first")
        self.hosts.setMaximumHeight(150)
        v.addWidget(self.hosts)
        row = QHBoxLayout()
        for text, slot in (("Add host", self.add_host), ("Remove host", self.remove_host)):
            b = QPushButton(text)
            b.clicked.connect(slot)
            row.addWidget(b)
        row.addStretch(1)
        v.addLayout(row)
        return box

    def _options(self) -> QFormLayout:
        form = QFormLayout()
        self.backend = QComboBox()
        self.backend.addItems(["ring", "jaccl"])
        self.backend.setToolTip("ring: TCP over any network; jaccl: RDMA over Thunderbolt 5")
        form.addRow("Backend", self.backend)
        split = QHBoxLayout()
        self.tensor = QRadioButton("Tensor parallel (every layer split)")
        self.pipeline = QRadioButton("Pipeline (layers divided)")
        self.tensor.setChecked(True)
        group = QButtonGroup(self)
        group.addButton(self.tensor)
        group.addButton(self.pipeline)
        split.addWidget(self.tensor)
        split.addWidget(self.pipeline)
        split.addStretch(1)
        form.addRow("Split", split)
        model = QHBoxLayout()
        self.model = QLineEdit(str(default_model_path()))
        self.model.setAccessibleName("Model folder")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self.pick_model)
        model.addWidget(self.model, 1)
        model.addWidget(browse)
        form.addRow("Model folder", model)
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(8080)
        form.addRow("Server port", self.port)
        self.ring_port = QSpinBox()
        self.ring_port.setRange(1024, 65535)
        self.ring_port.setValue(DEFAULT_PORT)
        self.ring_port.setToolTip("ring backend: the first of the ports the hosts talk on")
        form.addRow("Ring port", self.ring_port)
        self.step_timeout = QSpinBox()
        self.step_timeout.setRange(1, 3600)
        self.step_timeout.setValue(int(STEP_TIMEOUT_S))
        self.step_timeout.setSuffix(" s")
        self.step_timeout.setToolTip("how long a step waits for the other hosts before the "
                                     "cluster is declared gone (raise it on slow links)")
        form.addRow("Step timeout", self.step_timeout)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("optional: needed to reach the server from other machines")
        form.addRow("API key", self.key)
        return form

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.write_button = QPushButton("Write hosts.json")
        self.write_button.clicked.connect(lambda: self.write())
        self.save_as_button = QPushButton("Save as…")
        self.save_as_button.clicked.connect(self.save_as)
        self.copy_button = QPushButton("Copy command")
        self.copy_button.clicked.connect(self.copy_command)
        self.start_button = QPushButton("Start over SSH")
        self.start_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Stop cluster")
        self.cancel_button.clicked.connect(self.cancel)
        self.cancel_button.setEnabled(False)
        for b in (self.write_button, self.save_as_button, self.copy_button, self.start_button,
                  self.cancel_button):
            row.addWidget(b)
        row.addStretch(1)
        self.copy_button.setEnabled(False)
        self.start_button.setEnabled(False)
        return row

    # -- the plan ------------------------------------------------------------------------------
    def add_host(self) -> None:
        self.hosts.insertRow(self.hosts.rowCount())

    def remove_host(self) -> None:
        row = self.hosts.currentRow()
        self.hosts.removeRow(row if row >= 0 else self.hosts.rowCount() - 1)

    def set_hosts(self, hosts: list[tuple[str, str]]) -> None:
        self.hosts.setRowCount(len(hosts))
        for i, pair in enumerate(hosts):
            for j, text in enumerate(pair):
                self.hosts.setItem(i, j, QTableWidgetItem(text))

    def plan(self) -> ClusterPlan:
        cell = lambda i, j: (self.hosts.item(i, j).text() if self.hosts.item(i, j) else "")  # noqa: E731
        rows = tuple((cell(i, 0), cell(i, 1)) for i in range(self.hosts.rowCount())
                     if cell(i, 0).strip() or cell(i, 1).strip())
        return ClusterPlan(rows, self.backend.currentText(),
                           "pipeline" if self.pipeline.isChecked() else "tensor",
                           self.model.text(), self.port.value(), self.key.text().strip(),
                           self.ring_port.value(), float(self.step_timeout.value()))

    def pick_model(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "The model folder", self.model.text())
        if path:
            self.model.setText(path)

    def save_as(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save the hostfile", str(self.hostfile),
                                              "JSON (*.json)")
        if path:
            self.write(Path(path))

    def write(self, path: Path | None = None) -> bool:
        """Write the hostfile (checked first) and show the command; False with one line."""
        plan = self.plan()
        try:
            self.written = plan.write(path or self.hostfile)
        except (ClusterError, OSError) as exc:
            self.written = None
            self.status.setText(f"✗ {str(exc).splitlines()[0]}")
            self.command.setPlainText("")
            self.copy_button.setEnabled(False)
            self.start_button.setEnabled(False)
            return False
        self.command.setPlainText(plan.shown_command(self.written, mask=True))
        self.copy_button.setEnabled(True)
        here, mlx = plan.runs_here(), importlib.util.find_spec("mlx") is not None
        self.start_button.setEnabled(here and mlx and self.running is None)
        where = ("Run it on this machine, or press Start over SSH." if here and mlx else
                 "Run it on the first host." if mlx else
                 "MLX is not installed here: run it on the first host.")
        self.status.setText(f"✓ Wrote {self.written} ({len(plan.hosts)} hosts). {where}")
        return True

    def copy_command(self) -> None:
        if self.written is not None:
            QGuiApplication.clipboard().setText(self.plan().shown_command(self.written))

    # -- running it ----------------------------------------------------------------------------
    def start(self) -> None:
        if self.running is not None or not self.write():
            return
        plan = self.plan()
        self.output.clear()
        self.running = ProcessOutput(plan.command(self.written))
        self.running.line.connect(self.on_line)
        self.running.ended.connect(self.on_ended)
        try:
            self.running.start()
        except OSError as exc:  # the launcher is missing or cannot run
            self.running = None
            self.status.setText(f"Could not start the cluster: {exc}")
            return
        self.start_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.status.setText("Starting the cluster…")

    @Slot(str)
    def on_line(self, text: str) -> None:
        self.output.appendPlainText(text)
        said = text[text.find("Serving "):] if "Serving " in text else ""
        if " on http" in said:  # ``engine serve``'s line (mlx.launch may prefix it)
            url = said.split(" on ", 1)[1].split()[0]
            url = self.plan().server_url(url)
            self.status.setText(f"✓ The cluster serves on {url}")
            self.server_ready.emit(url)

    @Slot(int)
    def on_ended(self, code: int) -> None:
        self.running = None
        self.cancel_button.setEnabled(False)
        self.start_button.setEnabled(self.written is not None)
        self.status.setText("The cluster stopped." if code in (0, -15, 130, 143) else
                            f"✗ The cluster exited with code {code}: see its output below.")

    def cancel(self) -> None:
        if self.running is not None:
            self.running.cancel()
