#!/bin/sh
# Counts the words of its first argument. Run only as the workflow's declared `word_count` tool.
printf '%s\n' "$1" | wc -w | tr -d ' '
