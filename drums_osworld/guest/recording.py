"""Screen recording with ffmpeg's x11grab, one recording at a time (OSWorld's harness records
every episode: ``/start_recording`` before the first step, ``/end_recording`` after scoring)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time


class RecordingError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Recorder:
    def __init__(self, workdir: str, display: str, size_fn) -> None:
        self.path = os.path.join(workdir, "recording.mp4")
        self.log_path = os.path.join(workdir, "recording.log")
        self.display = display
        self._size_fn = size_fn
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def start(self) -> None:
        with self._lock:
            ffmpeg = shutil.which("ffmpeg")
            if ffmpeg is None:
                raise RecordingError(501, "ffmpeg is not installed in this desktop; cannot record")
            if self._proc is not None and self._proc.poll() is None:
                raise RecordingError(400, "Recording is already in progress.")
            self._proc = None
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise RecordingError(500, f"Failed to remove old recording file: {exc}") from exc
            w, h = self._size_fn()
            cmd = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
                   "-f", "x11grab", "-draw_mouse", "1", "-framerate", "30",
                   "-video_size", f"{w}x{h}", "-i", self.display,
                   "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", self.path]
            with open(self.log_path, "wb") as log:
                self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=log,
                                              start_new_session=True)
            # Return once ffmpeg has opened its output (its grab is running): a stop that arrives
            # before that leaves an empty file, which a loaded machine made happen. At least 1 s.
            started = time.monotonic()
            while True:
                if self._proc.poll() is not None:
                    self._proc = None
                    raise RecordingError(
                        500, "Failed to start recording. ffmpeg terminated unexpectedly. "
                        f"Error: {self._log_tail()}")
                waited = time.monotonic() - started
                if waited >= 1.0 and (os.path.exists(self.path) or waited >= 15.0):
                    break
                time.sleep(0.05)

    def stop(self) -> str:
        """Stop and return the path of the finished mp4."""
        with self._lock:
            p = self._proc
            if p is None or p.poll() is not None:
                self._proc = None
                raise RecordingError(400, "No recording in progress to stop.")
            self._proc = None
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise RecordingError(
                    500, "Recording process was unresponsive and had to be killed. "
                    f"Stderr: {self._log_tail()}") from None
            if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
                raise RecordingError(
                    500, "Recording failed. The output file is missing or empty. "
                    f"ffmpeg stderr: {self._log_tail()}")
            return self.path

    def abort(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
