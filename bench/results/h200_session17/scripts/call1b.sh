#!/bin/bash
# Session 17, call 1b (the command as it ran, carry: [".dev-ncu"] holding call 1's two reports): the source page of
# each report by line and by SASS instruction, as CSV.
cd .dev-ncu && for g in 0 1; do ncu -i s4_g$g.ncu-rep --page source --csv --print-source sass > sass_g$g.csv 2>sass_g$g.err; echo rc=$? $(wc -l < sass_g$g.csv); ncu -i s4_g$g.ncu-rep --page source --csv --print-source cuda,sass > both_g$g.csv 2>both_g$g.err; echo rc=$? $(wc -l < both_g$g.csv); done; head -c 1500 sass_g0.csv; tar -czf $OUT/src.tgz sass_g*.csv both_g*.csv *.err
