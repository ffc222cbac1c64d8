"""Plotly figures: pure builders (data in, figure out), shared by Live and Replay."""
