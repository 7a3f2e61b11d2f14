// A Neo4j Community DBMS (org.neo4j.test:neo4j-harness, the version tasks/graph/neo4j_local.py
// pins) in this JVM, for the tests and for trying the production store on one machine
// (`slm-nightly graph local-neo4j`). tasks/graph/neo4j_local.py resolves the jars with Maven
// into the build cache, compiles this file there and runs it; the project only ever talks to
// it over Bolt.
//
//   java -cp 'lib/*:classes' LocalNeo4j WORKDIR [setting=value ...] < password-then-EOF-later
//
// - Bolt only (no HTTP), on 127.0.0.1 at a port the server picks; authentication on.
// - The first line of stdin is the password for user `neo4j` (never a command-line argument:
//   `ps` shows those). The DBMS lives until stdin closes, so it never outlives its parent.
// - `setting=value` pairs are Neo4j settings by their config names
//   (e.g. db.memory.transaction.max=64m), parsed as neo4j.conf would parse them.
// - stdout carries exactly one line, `BOLT <uri>`, once the database answers; everything the
//   DBMS says goes to stderr or to its logs under WORKDIR.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Map;

import org.neo4j.configuration.Config;
import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.SettingImpl;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.graphdb.config.Setting;
import org.neo4j.harness.Neo4j;
import org.neo4j.harness.Neo4jBuilder;
import org.neo4j.harness.Neo4jBuilders;

public final class LocalNeo4j {
    private LocalNeo4j() {}

    public static void main(String[] args) throws Exception {
        PrintStream out = System.out;
        System.setOut(System.err); // the DBMS's own chatter never reaches the URI line
        if (args.length < 1) {
            fail("usage: LocalNeo4j WORKDIR [setting=value ...] (password on stdin)");
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String password = in.readLine();
        if (password == null || password.length() < 8) {
            // dbms.security.auth_minimum_password_length defaults to 8
            fail("the first line of stdin must be the neo4j user's password, 8 characters or more");
        }
        Neo4jBuilder builder = Neo4jBuilders.newInProcessBuilder(Path.of(args[0]))
                .withDisabledServer()
                .withConfig(GraphDatabaseSettings.auth_enabled, true)
                .withConfig(BoltConnector.enabled, true)
                .withConfig(BoltConnector.listen_address, new SocketAddress("127.0.0.1", 0));
        Config names = Config.defaults();
        for (int i = 1; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            Setting<Object> setting = kv.length == 2 ? names.getSetting(kv[0]) : null;
            if (setting == null) {
                fail("not a Neo4j setting=value pair: " + args[i]);
            }
            builder = builder.withConfig(setting, ((SettingImpl<Object>) setting).parse(kv[1]));
        }
        try (Neo4j neo4j = builder.build()) {
            // Embedded access to the system database needs no login; Community has this one user.
            neo4j.databaseManagementService().database("system").executeTransactionally(
                    "ALTER USER neo4j SET PASSWORD $password CHANGE NOT REQUIRED",
                    Map.of("password", password));
            out.println("BOLT " + neo4j.boltURI());
            out.flush();
            while (in.read() != -1) {
                // lives until its parent closes stdin (or dies)
            }
        }
    }

    private static void fail(String message) {
        System.err.println("LocalNeo4j: " + message);
        System.exit(2);
    }
}
