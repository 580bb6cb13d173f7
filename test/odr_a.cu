// test/odr_a.cu: one of the two translation units of odr_test (see odr.hpp). odr_b.cu expands
// the same macro for unit b: another formula, and a kernel of the same name.
#include "odr.hpp"

ODR_TRANSLATION_UNIT(a)
