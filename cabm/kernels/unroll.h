// CABM_UNROLL: put before a loop over the rows or columns of a register block (a compile-time
// count) whose vectors live in an array. GCC then unrolls the loop before its scalar replacement
// of aggregates, and the array becomes registers. Without it GCC 12 kept such arrays in memory
// around the hot loop (zeroed on the stack at entry, stored there after the loop, copied out
// again): the decode kernel's 4 × 4 score tile wrote 28 vectors to the stack per 16 dot products,
// and with the pragma its one-thread decode ran 10–30% faster (Zen 4, `cabm bench decode`).
#pragma once

#define CABM_UNROLL _Pragma("GCC unroll 16")
