"""Text from outside the program, bounded where it is read and printed (bounded_text.py), and what is known of a
spec file's text without the spec code (spec_text.py). A leaf stage: it imports nothing of solbench.

Stage ``text`` (solbench/stages.py): it imports its own modules and the stages below it, base.
"""
