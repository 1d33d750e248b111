/* Stand-in for <criterion/logging.h> under TSan: see criterion.h. */
#include <criterion/criterion.h>
