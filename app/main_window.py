"""The main chat window (shell; the chat issue fills it in)."""
from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QLabel, QMainWindow, QMessageBox, QVBoxLayout, QWidget

from app import __version__


class MainWindow(QMainWindow):
    def __init__(self, model_path: str | None = None) -> None:
        super().__init__()
        self.setWindowTitle("MTP Chat")
        self.resize(1100, 750)
        central = QWidget(self)
        lay = QVBoxLayout(central)
        self.chat_area = QLabel("No conversation yet.", central)
        self.chat_area.setAccessibleName("Chat area")
        lay.addWidget(self.chat_area)
        self.setCentralWidget(central)
        menu = self.menuBar().addMenu("&File")
        quit_action = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit,
                              triggered=self.close)
        menu.addAction(quit_action)
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction(QAction("&About MTP Chat", self, triggered=self.show_about))

    def show_about(self) -> None:
        QMessageBox.about(self, "About MTP Chat", f"MTP Chat {__version__}")
