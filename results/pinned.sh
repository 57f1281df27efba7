# Sourced by the result scripts from the repository root: `. results/pinned.sh REV` runs the code of
# commit REV, unpacked once under runs/ (ignored by git), so development may go on in src/ while a
# multi-session benchmark keeps one code; with packed oneDNN layers (taps.linear).
SRC=runs/bench-src-$1
[ -d $SRC ] || { mkdir -p $SRC.tmp && git archive $1 src | tar -x -C $SRC.tmp && mv $SRC.tmp $SRC; }
export PYTHONPATH=$PWD/$SRC/src
export TAPS_LINEAR=onednn-packed
