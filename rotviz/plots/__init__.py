"""Plotly figures for rotviz, built by pure functions from plain data (lists, dicts, arrays).

Every figure has a title, axis labels with units, a legend and the Okabe-Ito palette
(`rotviz.plots.style`). The app draws them; tests call them directly.
"""
