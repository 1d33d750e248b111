// Holds ~300 MiB of small objects on "hold", drops them with System.gc()
// on "drop"; "flush" starts and joins a thread (its stack guard pages are
// an mprotect, on which the preload may reconcile its mapped figure).
import java.io.BufferedReader;
import java.io.InputStreamReader;

public class Hold {
    static final class Node {
        long a, b, c, d;
        Node next;
    }

    static Node[] held;

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("ready");
        String line;
        while ((line = in.readLine()) != null) {
            switch (line) {
            case "hold":
                held = new Node[6 << 20];
                for (int i = 0; i < held.length; i++) {
                    held[i] = new Node();
                    held[i].a = i;
                }
                System.out.println("ok held");
                break;
            case "drop":
                held = null;
                System.gc();
                System.out.println("ok dropped");
                break;
            case "flush":
                Thread t = new Thread(() -> { });
                t.start();
                t.join();
                System.out.println("ok flushed");
                break;
            case "exit":
                return;
            }
        }
    }
}
