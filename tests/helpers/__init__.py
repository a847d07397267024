"""What the tests of several tiers share (tests/unit, tests/inprocess, tests/cluster).

Imported as `helpers.<module>`: pytest puts tests/ on sys.path when it loads tests/conftest.py,
and run_cluster passes that path on to its child processes. Nothing here is collected as a test.
"""
