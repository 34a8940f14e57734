#include "fake_openai_server.h"
int main(){return 0;}
