"""Version-independent machinery that installs patch points into torch."""
