"""Build runners: start, poll and cancel the builds of speculation paths."""
