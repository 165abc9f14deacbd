/* harness.h - what every test includes: cmocka and the ledger. */
#ifndef TAGALLOC_TEST_HARNESS_H
#define TAGALLOC_TEST_HARNESS_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "tagalloc.h"
#endif
