"""What a run tells: the terminal summary, the wall-time line and the studies report; saved runs
judged again (attnperf rejudge)."""
