/* A library with a large thread-local array: a thread that touches it gets
 * its TLS block from malloc (a large object), which glibc frees when it
 * evicts the thread's cached stack, while holding its stack-cache lock. */
__thread char pagewise_test_big_tls[300000];

char *pagewise_test_touch_tls(void) {
    pagewise_test_big_tls[0] = 1;
    pagewise_test_big_tls[sizeof pagewise_test_big_tls - 1] = 2;
    return pagewise_test_big_tls;
}
