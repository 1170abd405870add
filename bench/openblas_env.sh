# Sourced by the bench scripts. OpenBLAS picks its kernels by the CPU's model number when it loads; on a CPU newer
# than the build (Debian 12's 0.3.21 on an Emerald Rapids Xeon) it runs its generic Prescott kernels, 5x slower, and
# every fp32 figure here would be OpenBLAS's mistake. Where it would, this names the kernels the CPU can run
# (OPENBLAS_CORETYPE) and says so in the output. A value already set is kept.
if [[ -z ${OPENBLAS_CORETYPE:-} ]]; then
  openblas_core=$(python3 -c 'import ctypes
l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p
print(l.openblas_get_corename().decode())' 2>/dev/null || true)
  case $openblas_core in
    ""|Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids|Excavator) ;;
    *)
      flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
      if [[ $flags == *" avx512f "* && $flags == *" avx512bw "* && $flags == *" avx512dq "* && $flags == *" avx512vl "* ]]; then
        export OPENBLAS_CORETYPE=SkylakeX
      elif [[ $flags == *" avx2 "* && $flags == *" fma "* ]]; then
        export OPENBLAS_CORETYPE=Haswell
      fi
      [[ -n ${OPENBLAS_CORETYPE:-} ]] &&
        echo "# OpenBLAS would run its $openblas_core kernels on this CPU; OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE here" ;;
  esac
fi
