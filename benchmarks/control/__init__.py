"""The control plane (control_plane.py) and the launcher's --timeline (timeline_cost.py, timeline_chart.py)."""
