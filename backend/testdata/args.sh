#!/bin/sh
# Writes its arguments, one per line in brackets, to args.txt.
for a in "$@"; do printf "[%s]\n" "$a"; done > args.txt
